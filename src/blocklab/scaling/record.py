"""A judged ladder as JSON: scaling.json, the numbers of the report (`scaling.report`)."""

from __future__ import annotations

import math
from typing import Any

from blocklab.scaling.judge import ScalingResult, family_level, family_verdicts
from blocklab.scaling.method import method_facts
from blocklab.statistics import evidence


def result_record(result: ScalingResult) -> dict[str, Any]:
    """The numbers of a judged ladder as JSON."""

    def iv(i: evidence.Interval | None) -> dict[str, Any] | None:
        return None if i is None else {"values": list(i.values), "mean": i.mean, "low": i.low, "high": i.high}

    return {
        "ladder": result.data.name,
        "baseline": result.baseline,
        "seeds": result.seeds,
        "rungs": result.data.rungs,
        "fits": [
            {
                "arch": f.arch,
                "reading": f.reading,
                "sizes": f.sizes,
                "means": f.means,
                "laws": {
                    form: {
                        "formula": c.law.formula(),
                        "residuals": list(c.residuals),
                        "f": c.f,
                        "p": c.p,
                        "describes": c.describes,
                    }
                    for form, c in f.checks.items()
                },
            }
            for f in result.fits.values()
        ],
        "parameters": [
            {
                "arch": e.arch,
                "reading": e.reading,
                "law": e.law,
                "at": e.at,
                "interval": iv(e.interval),
                "per_rung": {r: iv(v) for r, v in e.per_rung.items()},
                "why": e.why,
                "untestable": e.untestable,
                "by_law": {law: [v if math.isfinite(v) else None for v in vs]  # None: beyond reach
                           for law, vs in e.by_law.items()},
                "beyond_ladder": e.outside,
                "beyond_ladder_per_rung": e.outside_per_rung,
            }
            for e in result.parameters.values()
        ],
        "data": [{"arch": e.arch, "interval": iv(e.interval)} for e in result.data_eq.values()],
        "gains": {a: {r: iv(v) for r, v in g.items()} for a, g in result.gains.items()},
        "headlines": [
            {
                "id": h.claim.id,
                "verdict": h.verdict,
                "interval": iv(h.interval),
                "text": h.text,
                "more": h.more,
                "paper_value": h.claim.paper_value,
                "paper_inside": h.paper_inside,
            }
            for h in result.headlines
        ],
        "family_wise": {"method": "Bonferroni", "level": 0.95, "each_interval_at": family_level(result),
                        "verdicts": family_verdicts(result)},
        "method": method_facts(result),
    }
