"""The served prediction API (docs/architecture.md, "Served API"): a FastAPI app answering queries of one oracle."""

from attnprobe.service.app import ServiceOptions, build_app
from attnprobe.service.keys import KeyStore

__all__ = ["KeyStore", "ServiceOptions", "build_app"]
