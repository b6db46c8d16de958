"""The Gauss–Newton acceptance rule (learners.core.descent): keep a step only when it lowers the residual."""

from attnprobe.learners.core.descent import keep_if_lower


def test_a_lower_residual_is_kept_and_recorded():
    history = [1.0]
    assert keep_if_lower(history, 0.5, "current", "trial", floor=1e-15) == ("trial", True)
    assert history == [1.0, 0.5]


def test_an_equal_or_higher_residual_is_refused_and_stops():
    for err in (1.0, 2.0, float("nan")):
        history = [1.0]
        assert keep_if_lower(history, err, "current", "trial", floor=1e-15) == ("current", False)
        assert history == [1.0]


def test_below_the_floor_the_step_is_kept_and_the_descent_stops():
    history = [1.0]
    assert keep_if_lower(history, 1e-16, "current", "trial", floor=1e-15) == ("trial", False)
    assert history == [1.0, 1e-16]
