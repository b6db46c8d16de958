"""attnprobe reproduce --quick: every available claim of the paper holds, with a figure and the paper's text."""

import json

from attnprobe.cli import main
from attnprobe.reproduce import CLAIMS


def test_reproduce_quick_every_claim_holds(tmp_path, capsys):
    out = tmp_path / "paper"
    assert main(["reproduce", "--quick", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    claims = {c["claim"]: c for c in res["claims"]}
    assert list(claims) == list(CLAIMS)
    available = [c for c in claims.values() if c["holds"] is not None]
    assert {c["claim"] for c in available} >= {"Thm 4.1", "Thm 5.1", "Thm 6.1", "App. B", "Sec 4.1"}
    assert all(c["holds"] is True and c["paper"] and c["measured"] for c in available)
    for c in claims.values():
        if c["holds"] is None:
            assert c["measured"].startswith("not yet available")
    assert claims["Thm 6.1"]["details"]["worst_W_ratio"] <= 1.0
    assert all(k <= claims["Thm 5.1"]["details"]["C_max"]
               for k in claims["Thm 5.1"]["details"]["transition_m_over_rd"].values())
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(available)
    assert len(list((out / "figures").glob("*.png"))) == len(available)
    assert f"{len(available)} claims hold, 0 do not" in capsys.readouterr().out


def test_reproduce_refuses_unknown_claims(tmp_path, capsys):
    assert main(["reproduce", "--claims", "Thm 9.9", "--out", str(tmp_path)]) == 2
    assert "unknown claim(s) Thm 9.9" in capsys.readouterr().err


def test_a_broken_experiment_is_reported_and_fails_the_run(tmp_path, monkeypatch, capsys):
    """An experiment that raises shows up as a claim that does not hold (exit 3); the others still run."""
    from attnprobe.reproduce import claims

    def broken(quick):
        raise ArithmeticError("boom")

    monkeypatch.setitem(claims.CLAIMS, "Thm 4.1", broken)
    assert main(["reproduce", "--quick", "--claims", "Thm 4.1,Sec 4.1", "--out", str(tmp_path)]) == 3
    res = {c["claim"]: c for c in json.loads((tmp_path / "results.json").read_text())["claims"]}
    assert res["Thm 4.1"]["holds"] is False and "ArithmeticError: boom" in res["Thm 4.1"]["measured"]
    assert res["Sec 4.1"]["holds"] is True
    assert "1 do not (Thm 4.1)" in capsys.readouterr().out
