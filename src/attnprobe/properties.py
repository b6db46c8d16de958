"""Read-only properties derived from another attribute, so that a fact is stored once: a model's widths are its
arrays' shapes, a wrapper's facts are those of the spec it wraps."""

from __future__ import annotations


def axis_length(array: str, axis: int, doc: str) -> property:
    """The length of axis ``axis`` of the object's array attribute ``array`` (e.g. ``d = axis_length("A", 0,
    "the input width")``)."""
    return property(lambda self: getattr(self, array).shape[axis], doc=doc)


def alias(path: str, doc: str) -> property:
    """The attribute at the dotted ``path`` of the object (e.g. ``layers = alias("spec.layers", ...)``)."""
    names = path.split(".")

    def get(self):
        for name in names:
            self = getattr(self, name)
        return self

    return property(get, doc=doc)
