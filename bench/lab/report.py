#!/usr/bin/python3
"""The tail lab's report: plots (latency CDF per environment, P99 and P99/P50 against environment)
and the headline ratios against the baselines of the same run, from the CSVs that
optireduce-bench and optireduce-mpi-bench append. Usage: report.py RESULTS_DIR"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: the lab runs headless
import matplotlib.pyplot as plt  # noqa: E402

BASELINES = ["gloo-ring", "gloo-bcube", "mpi"]
# Both bounded variants are held to the goals; the first is the library's default (Hadamard on).
OURS_ALL = ["tar-bounded-ht", "tar-bounded"]
ENV_ORDER = ["idle", "bg15", "bg30", "loss", "straggler"]
STYLE = {
    "tar-bounded-ht": ("tab:red", "-"),
    "tar-bounded": ("tab:orange", "-"),
    "tar-exact": ("tab:purple", "--"),
    "gloo-ring": ("tab:blue", "-"),
    "gloo-bcube": ("tab:cyan", "--"),
    "mpi": ("tab:green", ":"),
}


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def is_nan(x):
    return isinstance(x, float) and math.isnan(x)


def pct(x):
    return f"{100 * x:.2f}%"


def goal(size, algo, env, what, value, target, ok, detail, fmt=lambda v: f"{v:.2f}",
         missing="not run"):
    """One row of the goals table; value NaN (a cell not run) gives "not run", never a failure."""
    if is_nan(value):
        return {"size": size, "algo": algo, "env": env, "goal": what, "measured": missing,
                "target": target, "met": "not run"}
    return {"size": size, "algo": algo, "env": env, "goal": what,
            "measured": fmt(value) + (f" ({detail})" if detail else ""),
            "target": target, "met": "yes" if ok(value) else "no"}


def straggler_cost(samples, algo, size):
    """Worst time on the iterations the straggler slept before, and the P50 of the others."""
    s = [(fnum(x["ms"]), x.get("straggle") == "1") for x in samples
         if x["env"] == "straggler" and x["algo"] == algo and int(x["bytes"]) == size]
    hit = [t for t, h in s if h]
    calm = sorted(t for t, h in s if not h)
    if not hit or not calm:
        return math.nan, math.nan
    return max(hit), calm[(len(calm) - 1) // 2]


def bounded_goals(ours, size, get, best, samples, bgrate):
    """The goals of a bounded variant at one size ("Gloo ring": gloo-ring, same env and size)."""
    mib = size / 2**20
    rows = []
    p50, ring50 = get("idle", ours, "p50_ms"), get("idle", "gloo-ring", "p50_ms")
    rows.append(goal(mib, ours, "idle", "P50 ours / Gloo ring", p50 / ring50, "<= 1.0",
                     lambda v: v <= 1.0, f"ours {p50:.1f} ms, ring {ring50:.1f} ms"))
    rows.append(goal(mib, ours, "idle", "delivered", get("idle", ours, "delivered"), ">= 99.9%",
                     lambda v: v >= 0.999, None, pct))
    p99, ring99 = get("bg30", ours, "p99_ms"), get("bg30", "gloo-ring", "p99_ms")
    b99, b99n = best("bg30", "p99_ms")
    rows.append(goal(mib, ours, "bg30", "P99 Gloo ring / ours", ring99 / p99, ">= 2.5",
                     lambda v: v >= 2.5,
                     f"ring {ring99:.1f} ms at P99/P50 {get('bg30', 'gloo-ring', 'p99_p50'):.2f}, "
                     f"ours {p99:.1f} ms; best baseline {b99n} {b99:.1f} ms"))
    rows.append(goal(mib, ours, "bg30", "delivered", get("bg30", ours, "delivered"), ">= 99.5%",
                     lambda v: v >= 0.995, None, pct))
    rows.append(goal(mib, ours, "bg30", "P99/P50 ours", get("bg30", ours, "p99_p50"), "<= 1.3",
                     lambda v: v <= 1.3, None))
    p99, ring99 = get("loss", ours, "p99_ms"), get("loss", "gloo-ring", "p99_ms")
    b99, b99n = best("loss", "p99_ms")
    rows.append(goal(mib, ours, "loss", "P99 Gloo ring / ours", ring99 / p99, ">= 3",
                     lambda v: v >= 3, f"ring {ring99:.1f} ms, ours {p99:.1f} ms; best baseline "
                     f"{b99n} {b99:.1f} ms"))
    rows.append(goal(mib, ours, "loss", "delivered", get("loss", ours, "delivered"), ">= 99.5%",
                     lambda v: v >= 0.995, None, pct))
    # Straggler cost: the others' time on the iterations the straggler slept before, against the
    # P50 of the other iterations. A call is two bounded phases (incast max: one round each),
    # each closed by tB at worst, so the deadline of a call is 2 tB.
    smax, sp50 = straggler_cost(samples, ours, size)
    tb = get("straggler", ours, "tb_ms")
    rmax, _ = straggler_cost(samples, "gloo-ring", size)
    cost = smax - sp50
    ring = ""
    if not math.isnan(rmax):
        ring = f"; Gloo ring worst {rmax:.0f} ms, {rmax / smax:.1f}x ours"
    rows.append(goal(mib, ours, "straggler", "ms a 2 s straggler costs the others",
                     cost if tb > 0 else math.nan,
                     f"<= 2 tB = {2 * tb:.0f} ms" if tb > 0 else "<= 2 tB",
                     lambda v: v <= 2 * tb,
                     f"worst {smax:.0f} ms on straggled iterations, others' P50 {sp50:.0f}, tB "
                     f"{tb:.0f} ms per phase{ring}", lambda v: f"{v:.0f}"))
    rows += background_goals(ours, size, bgrate)
    return rows


def exact_goals(size, get, bgrate):
    mib = size / 2**20
    a = "tar-exact"
    p50, ring50 = get("idle", a, "p50_ms"), get("idle", "gloo-ring", "p50_ms")
    p99, ring99 = get("bg30", a, "p99_ms"), get("bg30", "gloo-ring", "p99_ms")
    return [
        goal(mib, a, "idle", "P50 ours / Gloo ring", p50 / ring50, "<= 1.0", lambda v: v <= 1.0,
             f"ours {p50:.1f} ms, ring {ring50:.1f} ms"),
        goal(mib, a, "bg30", "P99 ours / Gloo ring", p99 / ring99, "<= 1.0", lambda v: v <= 1.0,
             f"ours {p99:.1f} ms, ring {ring99:.1f} ms"),
    ] + background_goals(a, size, bgrate)


def background_goals(algo, size, bgrate):
    """Background TCP beside `algo` keeps >= 80% of the rate it gets beside Gloo ring: bytes per
    second in which its bursts ran (pauses between bursts would only dilute the figure)."""
    rows = []
    for env in ("bg15", "bg30"):
        ours, ring = bgrate(env, algo, size), bgrate(env, "gloo-ring", size)
        value = ours["rate"] / ring["rate"] if ours and ring else math.nan
        # A run shorter than the background's pauses may see no burst at all: nothing measured.
        quiet = [a for a in (algo, "gloo-ring") if bgrate(env, a, size) is False]
        missing = f"no burst during the {' and '.join(quiet)} run" if quiet else "not run"
        detail = None
        if ours and ring:
            detail = (f"{ours['rate'] * 8e-6:.0f} vs {ring['rate'] * 8e-6:.0f} Mbit/s while "
                      f"bursting, {ours['active']:.1f} s / {ring['active']:.1f} s of bursts")
        rows.append(goal(size / 2**20, algo, env, "background TCP rate beside ours / beside Gloo "
                         "ring", value, ">= 0.8", lambda v: v >= 0.8, detail, missing=missing))
    return rows


def goals_table(goal_rows):
    lines = ["| size MiB | algo | env | goal | measured | target | met |",
             "|---|---|---|---|---|---|---|"]
    for g in goal_rows:
        lines.append(f"| {g['size']:g} | {g['algo']} | {g['env']} | {g['goal']} | {g['measured']} "
                     f"| {g['target']} | {g['met']} |")
    met = sum(g["met"] == "yes" for g in goal_rows)
    failed = sum(g["met"] == "no" for g in goal_rows)
    missing = sum(g["met"] == "not run" for g in goal_rows)
    lines.append("")
    lines.append(f"Goals met: {met} of {met + failed} measured ({missing} not run).")
    return lines


def headroom_plot(out, by, sweep, size, suffix):
    """bg30 at each headroom (non-default, opt-in): delivered fraction against P99."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for a, dy in (("tar-bounded-ht", 4), ("tar-bounded", -10)):
        pts = [(e[len("bg30-h"):], by[(e, a)]) for e in sweep if (e, a) in by]
        if ("bg30", a) in by:
            pts.append(("default", by[("bg30", a)]))
        if not pts:
            continue
        xs = [fnum(r["p99_ms"]) for _, r in pts]
        ys = [100 * fnum(r["delivered"]) for _, r in pts]
        c, _ = STYLE[a]
        ax.scatter(xs, ys, color=c, label=a)
        for (h, _), x, y in zip(pts, xs, ys):
            ax.annotate(h, (x, y), textcoords="offset points", xytext=(4, dy), fontsize=8)
    ring = by.get(("bg30", "gloo-ring"))
    if ring:
        ax.axvline(fnum(ring["p99_ms"]) / 2, color="tab:blue", linestyle="--",
                   label="Gloo ring P99 / 2 (goal: left of it)")
    ax.axhline(99.5, color="gray", linestyle=":", label="99.5% delivered (goal: above)")
    ax.set_xlabel(f"P99 (ms), bg30, {size / 2**20:g} MiB")
    ax.set_ylabel("delivered (%)")
    ax.set_title("non-default OPTIREDUCE_TIMEOUT_HEADROOM: P99 against delivered")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"headroom{suffix}.png"), dpi=110)
    plt.close(fig)


def plots(out, rows, samples, size, suffix):
    """Latency CDF per environment, P99 and P99/P50 against environment, at one size."""
    rows = [r for r in rows if int(r["bytes"]) == size]
    envs = [e for e in ENV_ORDER if any(r["env"] == e for r in rows)]
    envs += sorted({r["env"] for r in rows} - set(envs))
    # bg30 again at other OPTIREDUCE_TIMEOUT_HEADROOM values (run-lab.sh HEADROOMS): a sweep of
    # one knob, plotted on its own, not an environment.
    sweep = [e for e in envs if e.startswith("bg30-h")]
    plain = [e for e in envs if e not in sweep]
    algos = [a for a in STYLE if any(r["algo"] == a for r in rows)]
    by = {(r["env"], r["algo"]): r for r in rows}

    for env in envs:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for a in algos:
            ms = sorted(fnum(s["ms"]) for s in samples
                        if s["env"] == env and s["algo"] == a and int(s["bytes"]) == size)
            if not ms:
                continue
            ys = [(i + 1) / len(ms) for i in range(len(ms))]
            c, ls = STYLE[a]
            ax.step(ms, ys, where="post", label=a, color=c, linestyle=ls)
        ax.set_xscale("log")
        ax.set_xlabel("allreduce time, max over ranks (ms, log)")
        ax.set_ylabel("CDF")
        ax.set_title(f"{env_label(env)}: {size / 2**20:g} MiB fp32, latency CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"cdf-{env}{suffix}.png"), dpi=110)
        plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(len(algos), 1)
    for i, a in enumerate(algos):
        xs = [k + (i - (len(algos) - 1) / 2) * width for k in range(len(plain))]
        p99 = [fnum(by[(e, a)]["p99_ms"]) if (e, a) in by else math.nan for e in plain]
        ratio = [fnum(by[(e, a)]["p99_p50"]) if (e, a) in by else math.nan for e in plain]
        c, _ = STYLE[a]
        axes[0].bar(xs, p99, width, label=a, color=c)
        axes[1].bar(xs, ratio, width, label=a, color=c)
    for ax, t in ((axes[0], "P99 (ms, log)"), (axes[1], "P99 / P50 (log)")):
        ax.set_xticks(range(len(plain)))
        ax.set_xticklabels(plain)
        ax.set_ylabel(t)
        ax.set_yscale("log")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"P99 against environment, {size / 2**20:g} MiB fp32")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"p99-vs-env{suffix}.png"), dpi=110)
    plt.close(fig)
    if sweep:
        headroom_plot(out, by, sweep, size, suffix)


def env_label(env):
    """bg30-h<value> rows ran with a knob set (run-lab.sh HEADROOMS, opt-in): say so wherever
    they appear, so that no one reads them as the defaults."""
    if env.startswith("bg30-h"):
        return f"{env} (NON-DEFAULT: OPTIREDUCE_TIMEOUT_HEADROOM={env[len('bg30-h'):]})"
    return env


def background_rates(out):
    """background.csv (run-lab.sh bg_measure) summed per (env, algo, size): the background's bytes,
    the seconds of the runs, and the seconds in which its bursts ran."""
    acc = {}
    for r in read(os.path.join(out, "background.csv")):
        try:
            key = (r["env"], r["algo"], int(r["size"]))
        except (KeyError, ValueError):
            continue
        a = acc.setdefault(key, {"bytes": 0.0, "seconds": 0.0, "active": 0.0})
        for k, col in (("bytes", "bytes"), ("seconds", "seconds"), ("active", "active_s")):
            v = fnum(r.get(col))
            if not math.isnan(v):
                a[k] += v
    for a in acc.values():
        a["rate"] = a["bytes"] / a["active"] if a["active"] > 0 else math.nan
        a["window_rate"] = a["bytes"] / a["seconds"] if a["seconds"] > 0 else math.nan
    return acc


def main(out):
    rows = read(os.path.join(out, "results.csv"))
    samples = read(os.path.join(out, "samples.csv"))
    if not rows:
        sys.exit("report.py: no results.csv in " + out)
    sizes = sorted({int(r["bytes"]) for r in rows})
    envs = [e for e in ENV_ORDER if any(r["env"] == e for r in rows)]
    envs += sorted({r["env"] for r in rows} - set(envs))
    algos = [a for a in STYLE if any(r["algo"] == a for r in rows)]
    by = {(r["env"], r["algo"], int(r["bytes"])): r for r in rows}

    # One set of plots per size; the names carry the size only when there are several.
    for size in sizes:
        plots(out, rows, samples, size, f"-{size / 2**20:g}MiB" if len(sizes) > 1 else "")

    bg = background_rates(out)

    def bgrate(env, algo, size):
        """The background's figures beside (env, algo, size); None: not run; False: run, but no
        burst overlapped it."""
        a = bg.get((env, algo, size))
        if a is None:
            return None
        return a if not math.isnan(a["rate"]) else False

    # Goals: against Gloo ring (and the best baseline) of the same run, env and size.
    goal_rows = []
    for size in sizes:
        def get(env, algo, col, size=size):
            r = by.get((env, algo, size))
            return fnum(r[col]) if r else math.nan

        def best(env, col, get=get):
            vals = [(get(env, b, col), b) for b in BASELINES if not math.isnan(get(env, b, col))]
            return min(vals) if vals else (math.nan, "-")

        for ours in OURS_ALL:
            if any(r["algo"] == ours for r in rows):
                goal_rows += bounded_goals(ours, size, get, best, samples, bgrate)
        if any(r["algo"] == "tar-exact" for r in rows):
            goal_rows += exact_goals(size, get, bgrate)
    table = goals_table(goal_rows)

    full = ["| size MiB | env | algo | P50 ms | P99 ms | P99.9 ms | mean ms | P99/P50 | "
            "busbw GB/s | delivered | rel. L2 err | deadline frac | CPU ms | ctx switches |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for e in envs:
            for a in algos:
                r = by.get((e, a, size))
                if not r:
                    continue
                full.append(
                    f"| {size / 2**20:g} | {env_label(e)} | {a} | {fnum(r['p50_ms']):.1f} | "
                    f"{fnum(r['p99_ms']):.1f} | {fnum(r['p999_ms']):.1f} | "
                    f"{fnum(r['mean_ms']):.1f} | {fnum(r['p99_p50']):.2f} | "
                    f"{fnum(r['busbw_gbs']):.3f} | "
                    f"{fnum(r['delivered']):.4f} | {fnum(r['rel_l2_err']):.1e} | "
                    f"{fnum(r['deadline_frac']):.2f} | {fnum(r.get('cpu_ms', 'nan')):.0f} | "
                    f"{fnum(r.get('csw', 'nan')):.0f} |"
                    .replace(" nan |", " - |"))
    bgtab = []
    if bg:
        bgtab = ["| size MiB | env | algo | background bytes | run s | bursting s | Mbit/s while "
                 "bursting | Mbit/s over the run |", "|---|---|---|---|---|---|---|---|"]
        order = {a: i for i, a in enumerate(STYLE)}
        for (e, a, size), v in sorted(bg.items(), key=lambda kv: (kv[0][2], kv[0][0],
                                                                    order.get(kv[0][1], 99))):
            bgtab.append(f"| {size / 2**20:g} | {env_label(e)} | {a} | {v['bytes']:.0f} | "
                         f"{v['seconds']:.1f} | {v['active']:.1f} | {v['rate'] * 8e-6:.0f} | "
                         f"{v['window_rate'] * 8e-6:.0f} |".replace("| nan |", "| - |"))
    cal = read(os.path.join(out, "calibration.csv"))
    caltab = ["| level | background | Gloo ring P50 ms | P99 ms | P99/P50 |", "|---|---|---|---|---|"]
    for r in cal:
        caltab.append(f"| {r['level']} | {r['background']} | {fnum(r['p50_ms']):.1f} | "
                      f"{fnum(r['p99_ms']):.1f} | {fnum(r['p99_p50']):.2f} |")
    knobs = []
    if os.path.exists(os.path.join(out, "knobs.txt")):
        with open(os.path.join(out, "knobs.txt")) as f:
            knobs = [x.strip() for x in f if x.strip()]
    if knobs:
        banner = ("**NOT the defaults**: every row ran with " + ", ".join(f"`{k}`" for k in knobs)
                  + " (run-lab.sh ALLOW_KNOBS=1).")
    else:
        banner = "All OPTIREDUCE_* settings at their defaults"
        if any(e.startswith("bg30-h") for e in envs):
            banner += " except the rows marked NON-DEFAULT (run-lab.sh HEADROOMS)"
        banner += "."
    head = (f"Sizes {', '.join(f'{s / 2**20:g}' for s in sizes)} MiB fp32. {banner}\n\n"
            "Goals (ours: the algorithm named; Gloo ring: gloo-ring in the same environment and "
            "size):\n\n")
    with open(os.path.join(out, "headline.md"), "w") as f:
        f.write(head + "\n".join(table) + "\n\n")
        f.write("\n".join(full) + "\n\n")
        if bgtab:
            f.write("Background TCP (iperf3 bursts) beside each algorithm (bytes: iptables "
                    "counters on the background's ports; bursting s: from the launch of a burst's "
                    "iperf3 clients, start-up included, to the end of the last):\n\n"
                    + "\n".join(bgtab) + "\n\n")
        if cal:
            f.write("Calibration (Gloo ring):\n\n" + "\n".join(caltab) + "\n")
    print(head + "\n".join(table))
    print()
    print("\n".join(full))
    if bgtab:
        print()
        print("\n".join(bgtab))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results")
