"""benchmarks/report.py reads every stored result (benchmarks/results/*.json) and prints a section for each: a
result written in a shape it does not know would otherwise break the tables silently, until someone reruns it."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_report_has_a_section_for_every_stored_result():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py")], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    stored = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("*.json"))
    missing = [name for name in stored if f"### `{name}`" not in out.stdout]
    assert stored and not missing, missing
