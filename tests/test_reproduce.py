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
