"""How the CLI shows a verify job: one progress line, and the result per collection."""

from __future__ import annotations

from typing import Any

from replicator.backfill.progress import bar

KINDS = ("missing", "extra", "different")
SHOWN_KEYS = 10


def verify_line(verify: dict[str, Any]) -> str:
    """``[######....]  3/10 ranges  30,000 rows compared  2 divergent  running``"""
    done, total = int(verify.get("ranges_done") or 0), int(verify.get("ranges_total") or 0)
    parts = [
        bar(done / total if total else 0.0),
        f"{done}/{total} ranges",
        f"{verify.get('rows_compared', 0):,} rows compared",
        f"{verify.get('divergent_rows', 0):,} divergent",
    ]
    if verify.get("repaired") is not None:
        parts.append(f"{verify['repaired']:,} repaired")
    parts.append(str(verify.get("state", "-")))
    if verify.get("reason"):
        parts.append(f"({verify['reason']})")
    return "  ".join(parts)


def verify_result(verify: dict[str, Any]) -> list[str]:
    """A line per collection and kind with divergent rows (a few keys each), unsettled ranges,
    and the job's notes."""
    lines = []
    for collection in verify.get("collections", []):
        name = collection["collection"]
        counts = ", ".join(f"{collection[k]['count']} {k}" for k in KINDS)
        lines.append(f"{name} -> {collection['target']}: {counts}")
        for kind in KINDS:
            found = collection[kind]
            if found["count"]:
                keys = ", ".join(repr(k) for k in found["keys"][:SHOWN_KEYS])
                more = " ..." if found["count"] > SHOWN_KEYS else ""
                lines.append(f"  {kind}: {keys}{more}")
        for unsettled in collection.get("unsettled", []):
            lines.append(f"  unsettled {unsettled}")
    lines += [f"note: {note}" for note in verify.get("notes", [])]
    return lines
