"""The boundary search's counts per boundary over several runs of ``bench/dr_boundaries.py``
(the whole table is run as several benches side by side, each on a part of the plan).

Reads the runs' result files in the order given; a row (job, boundary, fault) counts as the last
run of it that reached its boundary (a later run of a row replaces an earlier one, a row not
reached stays so only when no run reached it). Each row is one of:

- *held*: the verb was accepted (2xx), or the kill or the stall was applied, and every
  invariant held;
- *refused as expected*: 409, 404 or 400 with every invariant held (the search checks that the
  answer names the state and that the world did not change);
- *not asked*: no daemon served (the only one held in its start's recover round, 503), or
  the flow had no other task to ask an ``:other`` verb of;
- *broken*: an invariant broke (the check's name in the table's ``invariants`` column);
- *not reached*: the job never reached the boundary in that world;
- *not run*: no run has the row.

    python bench/dr_boundaries_merge.py RESULT.md [RESULT.md ...]

Prints a markdown table a job, a line a boundary, and the totals.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness.dr_boundaries import FAULTS, HELD_TOO, NO_DAEMON_SERVING, NO_OTHER_TASK  # noqa: E402

from server.dr.flows import BOUNDARIES  # noqa: E402

KINDS = ("held", "refused as expected", "not asked", "broken", "not reached", "not run")
ANSWER = re.compile(r"^\S+ \S+: (\d{3})\b")


def kind_of(held: str, invariants: str, fault: str, outcome: str) -> str:
    if held != "yes":
        return "not reached"
    if invariants != "all held":
        return "broken"
    if NO_DAEMON_SERVING in outcome or NO_OTHER_TASK in outcome:
        return "not asked"
    # the verb's own job held at the same point by the search: accepted, its answer the hold's
    if fault in ("kill", "stall") or HELD_TOO in outcome:
        return "held"
    answer = ANSWER.match(outcome)
    if answer is None:
        raise ValueError(f"no answer in the outcome of a {fault} row: {outcome[:120]}")
    return "held" if answer.group(1).startswith("2") else "refused as expected"


def rows_of(path: Path) -> list[tuple[str, str, str, str]]:
    """(job, boundary, fault, kind) of each row of one result file, in its order."""
    found = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] not in BOUNDARIES or cells[1] not in BOUNDARIES[cells[0]]:
            continue
        job, point, fault, held, invariants, outcome, _seconds = cells
        found.append((job, point, fault, kind_of(held, invariants, fault, outcome)))
    return found


def merge(paths: list[Path]) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(job, boundary, fault) -> (kind, the file's stem) of the run that counts."""
    counted: dict[tuple[str, str, str], tuple[str, str]] = {}
    for path in paths:
        for job, point, fault, kind in rows_of(path):
            key = (job, point, fault)
            if kind == "not reached" and key in counted and counted[key][0] != "not reached":
                continue
            counted[key] = (kind, path.stem)
    return counted


def table(counted: dict[tuple[str, str, str], tuple[str, str]]) -> str:
    lines: list[str] = []
    totals = dict.fromkeys(KINDS, 0)
    for job, points in BOUNDARIES.items():
        lines += [
            f"#### {job}",
            "",
            "| boundary | " + " | ".join(KINDS) + " | where |",
            "|---|" + "---|" * (len(KINDS) + 1),
        ]
        for point in points:
            counts = dict.fromkeys(KINDS, 0)
            where: list[str] = []
            for fault in FAULTS:
                kind, stem = counted.get((job, point, fault), ("not run", ""))
                counts[kind] += 1
                if stem and stem not in where:
                    where.append(stem)
            for kind, n in counts.items():
                totals[kind] += n
            cells = " | ".join(str(counts[k]) for k in KINDS)
            lines.append(f"| {point} | {cells} | {','.join(where)} |")
        lines.append("")
    all_rows = sum(totals.values())
    lines.append(
        f"Totals over {all_rows} rows: " + ", ".join(f"{n} {k}" for k, n in totals.items()) + "."
    )
    broken = sorted(key for key, (kind, _) in counted.items() if kind == "broken")
    if broken:
        lines += ["", "Broken: " + "; ".join(" x ".join(k) for k in broken)]
    return "\n".join(lines)


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        raise SystemExit(__doc__)
    print(table(merge(paths)))


if __name__ == "__main__":
    main()
