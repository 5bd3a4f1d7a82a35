"""Goals, verdicts and the Markdown results file, all computed from one summary dict (the
same dict is saved as JSON next to the Markdown, so a table can be re-rendered later)."""

from __future__ import annotations

import math
from typing import Any

NAN = math.nan


def _num(v: Any, fmt: str = "{:,.0f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return fmt.format(v)


def _cell(summary: dict[str, Any], server: str, scenario: str) -> dict[str, Any] | None:
    for c in summary["cells"]:
        if c["server"] == server and c["scenario"] == scenario and c["runs"]:
            return c
    return None


def _busy(other: float | None) -> bool:
    """Other tenants used more than 60% of a core during this cell's measurements."""
    return other is not None and not math.isnan(other) and other > 60


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return NAN
    return a / b


def cpu_us(cell: dict[str, Any] | None) -> float:
    """Server CPU µs per request of a cell; derived from its CPU % and req/s in results
    saved before the harness kept the figure (2026-11-28)."""
    if not cell:
        return NAN
    value = cell.get("server_cpu_us")
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    pct, rps = cell.get("server_cpu_pct"), cell.get("rps")
    if pct is None or not rps or math.isnan(pct) or math.isnan(rps) or pct <= 0:
        return NAN  # no CPU seen: the window missed the load (``cpu_us_per_request``)
    return pct * 1e4 / rps


#: Issue 40's row-by-row goals against Triton: (goal, oipserve's figure over Triton's, the
#: bound, whether the ratio must stay at or below it, which rows count: those whose key ends
#: so, and paced rows only where the last is true — a paced row's rate is the client's, the
#: same for every server that keeps up).
_TRITON_ROW_GOALS: tuple[tuple[str, str, float, bool, str, bool], ...] = (
    (
        "default configuration: oipserve ≥ 1.0× Triton's req/s on every row",
        "rps", 1.0, False, "", False,
    ),
    ("p99 ≤ 1.5× Triton's on every row", "p99_ms", 1.5, True, "", True),
    ("server CPU per request ≤ 1.0× Triton's on every row", "cpu_us", 1.0, True, "", True),
    ("c=1: oipserve p50 ≤ Triton's", "p50_ms", 1.0, True, "-c1", True),
)  # fmt: skip


def _figure(cell: dict[str, Any] | None, what: str) -> float:
    if not cell:
        return NAN
    return cpu_us(cell) if what == "cpu_us" else float(cell.get(what, NAN))


def triton_row_ratios(
    summary: dict[str, Any], what: str, suffix: str = "", paced: bool = True
) -> list[tuple[str, float]]:
    """oipserve's ``what`` over Triton's, per scenario both measured (ending in ``suffix``;
    paced ones only if ``paced``: results files from before paced rows have no ``rate``)."""
    rows = []
    for scen in summary["scenarios"]:
        if not scen["key"].endswith(suffix) or (scen.get("rate") and not paced):
            continue
        oip, tri = _cell(summary, "oipserve", scen["key"]), _cell(summary, "triton", scen["key"])
        r = _ratio(_figure(oip, what), _figure(tri, what))
        if not math.isnan(r):
            rows.append((scen["key"], r))
    return rows


def bottleneck_text(summary: dict[str, Any], scenario: str) -> str:
    """What the CPU accounting and the profiler say about oipserve in `scenario`."""
    parts = []
    cell = _cell(summary, "oipserve", scenario)
    if cell:
        busiest = cell.get("server_top") or []
        if busiest:
            name, pct = busiest[0]
            parts.append(f"busiest process `{name}` at {pct:.0f}% of a core")
        total = (cell.get("server_cpu_pct") or 0) + (cell.get("client_cpu_pct") or 0)
        if total >= 170:
            parts.append(
                f"the 2 cores are nearly all in use (server {cell['server_cpu_pct']:.0f}% + "
                f"client {cell['client_cpu_pct']:.0f}%)"
            )
    for prof in summary.get("profiles", []):
        if prof["scenario"] != scenario:
            continue
        native = prof.get("front_native")
        if native and native["top"]:
            hot = ", ".join(
                f"`{fn}` {pct:.0f}%" + (f" (from `{caller}`)" if caller and caller != fn else "")
                for fn, pct, caller in native["top"][:4]
            )
            parts.append(f"py-spy --native on the front process: {hot}")
        workers = [p for p in prof.get("processes", []) if p["cmd"] and "-m workers" in p["cmd"]]
        if prof.get("processes"):
            front = prof["processes"][0]
            funcs = ", ".join(f"`{fn}` {s:.0f}%" for fn, s, _ in front["top"][:3])
            parts.append(
                f"Python frames of the busiest process ({front['samples']} samples): {funcs}"
            )
        if workers:
            parts.append(
                f"ORT workers sampled {sum(w['samples'] for w in workers)} times vs "
                f"{prof['processes'][0]['samples']} for the busiest process"
            )
    return "; ".join(parts) if parts else "no profile taken"


def evaluate_goals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of issues 7 and 40 (plus overload), each met / missed / not measured."""
    goals: list[dict[str, Any]] = []

    def add(
        goal: str,
        measured: str,
        met: bool | None,
        scenario: str,
        why: str = "",
        servers: tuple[str, ...] = (),
    ) -> None:
        disturbed = [
            c["server"]
            for c in summary["cells"]
            if c["scenario"] == scenario
            and c["runs"]
            and c["server"] in servers
            and _busy(c.get("other_cpu_pct"))
        ]
        if disturbed and measured != "—":
            measured += f" ‡ (other tenants busy while measuring {', '.join(disturbed)})"
        entry = {"goal": goal, "measured": measured, "met": met, "scenario": scenario}
        if met is False:
            entry["bottleneck"] = bottleneck_text(summary, scenario)
        if met is None:
            entry["why"] = why
        goals.append(entry)

    oip_c16 = _cell(summary, "oipserve", "tiny-json-c16")
    for peer, label in (("mlserver", "MLServer (parallel_workers=0)"), ("kserve", "KServe")):
        peer_cell = _cell(summary, peer, "tiny-json-c16")
        r = _ratio(oip_c16 and oip_c16["rps"], peer_cell and peer_cell["rps"])
        add(
            f"tiny JSON c=16: oipserve ≥ 5× {label} req/s",
            "—"
            if math.isnan(r)
            else f"{oip_c16['rps']:,.0f} vs {peer_cell['rps']:,.0f} req/s = {r:.1f}×",  # type: ignore[index]
            None if math.isnan(r) else r >= 5.0,
            "tiny-json-c16",
            "oipserve or the peer has no result",
            ("oipserve", peer),
        )
    oip_c1 = _cell(summary, "oipserve", "tiny-json-c1")
    for peer, label in (("mlserver", "MLServer"), ("kserve", "KServe")):
        peer_cell = _cell(summary, peer, "tiny-json-c1")
        r = _ratio(oip_c1 and oip_c1["p50_ms"], peer_cell and peer_cell["p50_ms"])
        add(
            f"tiny JSON c=1: oipserve p50 ≤ ½ of {label}'s",
            "—"
            if math.isnan(r)
            else f"{oip_c1['p50_ms']:.2f} vs {peer_cell['p50_ms']:.2f} ms = {r:.2f}×",  # type: ignore[index]
            None if math.isnan(r) else r <= 0.5,
            "tiny-json-c1",
            "oipserve or the peer has no result",
            ("oipserve", peer),
        )
    oip_mib = _cell(summary, "oipserve", "mib-binary-c4")
    tri_mib = _cell(summary, "triton", "mib-binary-c4")
    r = _ratio(oip_mib and oip_mib["mbps"], tri_mib and tri_mib["mbps"])
    add(
        "1 MiB binary: oipserve MB/s ≥ Triton's",
        "—"
        if math.isnan(r)
        else f"{oip_mib['mbps']:,.0f} vs {tri_mib['mbps']:,.0f} MB/s = {r:.2f}×",  # type: ignore[index]
        None if math.isnan(r) else r >= 1.0,
        "mib-binary-c4",
        "oipserve or Triton has no result",
        ("oipserve", "triton"),
    )
    floor = summary.get("floor", {}).get("matmul")
    best_key, best = "", None
    for key in ("matmul-binary-c4", "matmul-grpc-c4"):
        c = _cell(summary, "oipserve", key)
        if c and (best is None or c["rps"] > best["rps"]):
            best_key, best = key, c
    r = _ratio(best and best["rps"], floor and floor["rps"])
    peer_best = max(
        (
            (c["rps"] / floor["rps"], c["server"], c["scenario"])
            for c in summary["cells"]
            if floor
            and c["runs"]
            and c["server"] not in ("oipserve", "floor")
            and c["scenario"].startswith("matmul")
        ),
        default=None,
    )
    add(
        "compute-bound: oipserve ≥ 90% of the in-process floor",
        "—"
        if math.isnan(r)
        else f"{best['rps']:,.0f} vs {floor['rps']:,.0f} calls/s = {100 * r:.0f}% ({best_key})",  # type: ignore[index]
        None if math.isnan(r) else r >= 0.9,
        best_key or "matmul-binary-c4",
        "oipserve or the floor has no result",
        ("oipserve", "floor"),
    )
    if goals[-1]["met"] is False and floor:
        context = (
            f"the model computes in {floor['p50_ms']:.2f} ms per call in-process (p50), "
            f"less than a request's protocol work, so the servers are overhead-bound here"
        )
        if peer_best:
            context += (
                f"; the best peer, {peer_best[1]} ({peer_best[2]}), reaches "
                f"{100 * peer_best[0]:.0f}% of the floor"
            )
        goals[-1]["bottleneck"] += "; " + context
    batched = _cell(summary, "oipserve", "matmul-batched-c16")
    tri_batched = _cell(summary, "triton", "matmul-batched-c16")
    r = _ratio(batched and batched["rps"], tri_batched and tri_batched["rps"])
    add(
        "dynamic batching (MatMul, 1 row a request, c=16): oipserve ≥ Triton's req/s, same config",
        "—"
        if math.isnan(r)
        else f"{batched['rps']:,.0f} vs {tri_batched['rps']:,.0f} req/s = {r:.2f}×",  # type: ignore[index]
        None if math.isnan(r) else r >= 1.0,
        "matmul-batched-c16",
        "oipserve or Triton has no result",
        ("oipserve", "triton"),
    )
    floor_b1 = summary.get("floor", {}).get("matmul-batch1")
    r = _ratio(batched and batched["rps"], floor_b1 and floor_b1["rps"])
    add(
        "dynamic batching: oipserve above the unbatched in-process floor (batch 1)",
        "—"
        if math.isnan(r)
        else f"{batched['rps']:,.0f} vs {floor_b1['rps']:,.0f} calls/s = {r:.2f}×",  # type: ignore[index]
        None if math.isnan(r) else r > 1.0,
        "matmul-batched-c16",
        "oipserve or the floor has no result",
        ("oipserve", "floor"),
    )
    for goal, what, bound, at_most, suffix, paced in _TRITON_ROW_GOALS:
        rows = triton_row_ratios(summary, what, suffix, paced)
        missed = [(k, r) for k, r in rows if (r > bound if at_most else r < bound)]
        worst = max(rows, key=lambda kr: kr[1] if at_most else -kr[1]) if rows else None
        measured = "—"
        if worst:
            measured = f"worst {worst[1]:.2f}× ({worst[0]}), {len(rows) - len(missed)} of "
            measured += f"{len(rows)} rows within"
            if missed:
                measured += "; missed: " + ", ".join(f"{k} {r:.2f}×" for k, r in missed)
        add(
            goal,
            measured,
            None if not rows else not missed,
            worst[0] if worst else "",
            "oipserve or Triton has no result",
            ("oipserve", "triton"),
        )
    over = next((o for o in summary.get("overload", []) if o["server"] == "oipserve"), None)
    add(
        "overload (2× saturating rate"
        + (f", {over['duration_s']} s" if over else "")
        + "): bounded latency and errors, "
        "no collapse",
        "—" if over is None else over["verdict_text"],
        None if over is None else over["bounded"],
        "overload",
        "oipserve was not overloaded",
    )
    return goals


def _verdict(met: bool | None) -> str:
    return {True: "**met**", False: "**MISSED**", None: "not measured"}[met]


def render(summary: dict[str, Any]) -> str:
    """The results Markdown."""
    s = summary
    lines: list[str] = []
    w = lines.append
    w(f"# oipserve and its peers, side by side — {s['title']}")
    w("")
    w(
        f"Command: `{s['command']}` — {s['rounds']} interleaved round(s), {s['duration_s']} s "
        f"per measurement after {s['warmup_s']} s of warm-up; figures are medians over rounds. "
        f"Wall time of the whole run: {s['wall_min']:.1f} min."
    )
    w("")
    if s.get("headline_note"):
        w(f"> {s['headline_note']}")
        w("")
    w("## Goals (ratios measured in this run)")
    w("")
    w("| goal | measured | verdict |")
    w("|---|---|---|")
    for g in s["goals"]:
        w(f"| {g['goal']} | {g['measured']} | {_verdict(g['met'])} |")
    w("")
    missed = [g for g in s["goals"] if g["met"] is False]
    if missed:
        w("Missed goals and the bottleneck found:")
        w("")
        for g in missed:
            w(f"- **{g['goal']}** — {g['bottleneck']}.")
        w("")
    unmeasured = [g for g in s["goals"] if g["met"] is None]
    if unmeasured:
        w("Not measured: " + "; ".join(f"{g['goal']} ({g['why']})" for g in unmeasured) + ".")
        w("")

    w("## Results")
    w("")
    w(
        "req/s, p50 and p99 are medians over rounds; *range* is the min–max req/s over rounds; "
        "*client CPU* is the load generator's own CPU (% of one core) and *server CPU* the whole "
        "server process tree's, both over the measured window (2 cores = 200%); *other CPU* is "
        "what the rest of the machine (other tenants of this shared box) used meanwhile; "
        "*CPU µs/req* is the server's CPU per request (server CPU over req/s, median over "
        "rounds). "
        "‡ marks a figure measured while other tenants used more than 60% of a core (median "
        "over rounds): compare it with care. *vs oipserve* is "
        "oipserve's req/s divided by that server's (for the floor: the server's share of it). "
        "MB/s counts tensor bytes in + out."
    )
    w("")
    labels = {sv["key"]: sv["label"] for sv in s["servers"]}
    unsupported = {sv["key"]: sv.get("unsupported", {}) for sv in s["servers"]}
    filters = {sv["key"]: sv.get("scenario_filter") for sv in s["servers"]}
    groups: dict[str, list[dict[str, Any]]] = {}
    for scen in s["scenarios"]:
        groups.setdefault(scen["group"], []).append(scen)
    for group, scens in groups.items():
        w(f"### {group}")
        w("")
        w(
            "| scenario | server | req/s | range | p50 ms | p99 ms | MB/s | errors | client CPU "
            "| server CPU | CPU µs/req | other CPU | vs oipserve |"
        )
        w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        skipped: list[str] = []
        for scen in scens:
            oip = _cell(s, "oipserve", scen["key"])
            rows = [c for c in s["cells"] if c["scenario"] == scen["key"]]
            for c in rows:
                name = labels.get(c["server"], c["server"])
                if not c["runs"]:
                    skipped.append(f"{scen['key']} / {name}: {c['note'] or 'no successful run'}")
                    continue
                if c["server"] == "oipserve":
                    vs = "—"
                elif c["server"] == "floor":
                    vs = _num(_ratio(oip and oip["rps"], c["rps"]), "{:.0%}") + " of floor"
                else:
                    vs = _num(_ratio(oip and oip["rps"], c["rps"]), "{:.1f}×")
                rng = f"{c['rps_min']:,.0f}–{c['rps_max']:,.0f}"
                mark = " ‡" if _busy(c.get("other_cpu_pct")) else ""
                w(
                    f"| {scen['label']} | {name} | {_num(c['rps'])}{mark} | {rng} | "
                    f"{_num(c['p50_ms'], '{:.2f}')} | {_num(c['p99_ms'], '{:.2f}')} | "
                    f"{_num(c['mbps'], '{:,.0f}')} | {c['errors']} | "
                    f"{_num(c['client_cpu_pct'], '{:.0f}%')} | "
                    f"{_num(c['server_cpu_pct'], '{:.0f}%')} | {_num(cpu_us(c))} | "
                    f"{_num(c.get('other_cpu_pct'), '{:.0f}%')} | {vs} |"
                )
            for key, why in sorted(unsupported.items()):
                only = filters.get(key)
                if only is not None and scen["key"] not in only:
                    continue
                if scen["protocol"] in why and not any(c["server"] == key for c in rows):
                    skipped.append(f"{scen['key']} / {labels[key]}: {why[scen['protocol']]}")
        w("")
        if skipped:
            w("Not in this table: " + "; ".join(skipped) + ".")
            w("")

    if s.get("overload"):
        w(
            "### 6. overload: 2× the saturating rate for "
            f"{s['overload'][0]['duration_s']} s (tiny model, REST JSON)"
        )
        w("")
        w(
            "Saturating rate = the higher of the server's median req/s at c=16 above and a "
            "fresh c=16 probe taken just before its overload run. wrk paces "
            f"{s['overload'][0]['connections']} connections to offer twice that rate; a request "
            f"counts as a timeout after {s['overload'][0]['timeout_s']} s. Bounded = still ready "
            "afterwards, p99 below the client timeout, ≤1% timeouts and ≥50% of the saturating "
            "rate still answered 2xx."
        )
        w("")
        w(
            "| server | saturating req/s | offered req/s | answered req/s | 2xx/s | statuses | "
            "socket errors | p50 ms | p99 ms | ready after | verdict |"
        )
        w("|---|---:|---:|---:|---:|---|---|---:|---:|---|---|")
        for o in s["overload"]:
            w(
                f"| {labels.get(o['server'], o['server'])} | {_num(o['saturating_rps'])} | "
                f"{_num(o['offered_rps'])} | {_num(o['rps'])} | {_num(o['ok_rps'])} | "
                f"{o['statuses'] or '—'} | {o['socket_errors'] or '—'} | "
                f"{_num(o['p50_ms'], '{:.1f}')} | {_num(o['p99_ms'], '{:.1f}')} | "
                f"{'yes' if o['ready_after'] else 'NO'} | "
                f"{'bounded' if o['bounded'] else '**collapse**'} |"
            )
        w("")

    if s.get("profiles"):
        w("## Profiles (py-spy, oipserve under load)")
        w("")
        w(
            "For each scenario: first the whole process tree in Python frames (non-blocking), then "
            "the front process with native frames (C code and syscalls, blocking, 100 Hz). In "
            "Python-only frames, time spent in C (uvloop, the kernel) counts as self time of the "
            "Python function that called it; e.g. `Runner.run` self time is the event loop's own "
            "C code. Percentages are shares of on-CPU samples of that process."
        )
        w("")
        for prof in s["profiles"]:
            w(f"**{prof['scenario']}**" + (f" ({prof['note']})" if prof.get("note") else ""))
            w("")
            native = prof.get("front_native")
            if native:
                w(
                    f"- front process, native ({native['samples']} on-CPU samples, "
                    f"{native.get('idle', 0)} blocked samples left out): "
                    + ", ".join(
                        f"`{fn}` {pct:.0f}%" + (f" ← `{caller}`" if caller and caller != fn else "")
                        for fn, pct, caller in native["top"][:8]
                    )
                )
            for p in prof["processes"][:3]:
                w(
                    f"- `{p['cmd'][:70]}` — {p['samples']} samples; top self time: "
                    + ", ".join(
                        f"`{fn}` {sp:.0f}% (incl. {ip:.0f}%)" for fn, sp, ip in p["top"][:6]
                    )
                )
            w("")

    if s.get("charts"):
        w("## Charts")
        w("")
        for title, path in s["charts"]:
            w(f"![{title}]({path})")
            w("")

    w("## Machine")
    w("")
    for k, v in s["machine"].items():
        w(f"- {k}: {v}")
    w("")
    w("## Versions")
    w("")
    for k, v in s["versions"].items():
        w(f"- {k}: {v}")
    w("")
    w("## Settings")
    w("")
    w(
        f"Common to all: ONNX Runtime {s['versions'].get('onnxruntime (all servers)', '')}, "
        f"CPU execution provider, intra-op threads {s['tuning']['intra_op_threads']}, inter-op "
        f"threads {s['tuning']['inter_op_threads']}, sequential execution; "
        f"{s['tuning']['instances']} model instances / worker processes where the server has "
        "such a knob; no server-side batching; every listener on 127.0.0.1."
    )
    w("")
    for sv in s["servers"]:
        w(
            f"- **{sv['label']}**"
            + (f" (failed to start: {sv['error'][:200]})" if sv.get("error") else "")
        )
        for item in sv["settings"]:
            w(f"  - {item}")
        if sv.get("idle_cpu_pct") is not None:
            w(f"  - idle CPU while the others were measured: {sv['idle_cpu_pct']:.1f}%")
    w("")
    w("## Method")
    w("")
    for item in s["method"]:
        w(f"- {item}")
    w("")
    if s.get("notes"):
        w("## Notes")
        w("")
        for item in s["notes"]:
            w(f"- {item}")
        w("")
    return "\n".join(lines)


def headline_table(summary: dict[str, Any]) -> str:
    """The short table README.md shows: the goal rows and the main req/s figures."""
    s = summary
    labels = {sv["key"]: sv["label"] for sv in s["servers"]}
    keys = [sv["key"] for sv in s["servers"]]
    lines = [
        "| scenario | " + " | ".join(labels[k] for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for scen in s["scenarios"]:
        row = []
        for k in keys:
            c = _cell(s, k, scen["key"])
            if not c:
                row.append("—")
            elif scen["payload"] and c.get("mbps"):
                row.append(f"{c['rps']:,.0f} req/s, {c['mbps']:,.0f} MB/s")
            else:
                row.append(f"{c['rps']:,.0f} req/s, p50 {c['p50_ms']:.2f} ms")
        lines.append(f"| {scen['key']} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append("| goal | measured | verdict |")
    lines.append("|---|---|---|")
    for g in s["goals"]:
        lines.append(f"| {g['goal']} | {g['measured']} | {_verdict(g['met'])} |")
    return "\n".join(lines)
