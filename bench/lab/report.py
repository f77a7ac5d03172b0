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


def headline_rows(ours, get, best, samples, size):
    """The four goals of the lab for one of our algorithms, as markdown table rows."""
    lines = []

    p99_ours, p99_ring = get("bg30", ours, "p99_ms"), get("bg30", "gloo-ring", "p99_ms")
    b99, b99n = best("bg30", "p99_ms")
    lines.append(
        f"| {ours} | P99 at P99/P50~3 (bg30): Gloo ring / ours >= 2 | ours {p99_ours:.1f} ms, ring "
        f"{p99_ring:.1f} ms (its P99/P50 {get('bg30', 'gloo-ring', 'p99_p50'):.2f}) | "
        f"{p99_ring / p99_ours:.2f}x lower | {b99 / p99_ours:.2f}x lower "
        f"({b99n}) | {'yes' if p99_ring / p99_ours >= 2 else 'no'} |")
    p50_ours, p50_ring = get("idle", ours, "p50_ms"), get("idle", "gloo-ring", "p50_ms")
    b50, b50n = best("idle", "p50_ms")
    lines.append(
        f"| {ours} | P50 idle: ours / Gloo ring <= 1.1 | ours {p50_ours:.1f} ms, ring {p50_ring:.1f} ms "
        f"| {p50_ours / p50_ring:.2f}x | {p50_ours / b50:.2f}x ({b50n}) | "
        f"{'yes' if p50_ours / p50_ring <= 1.1 else 'no'} |")
    dl = get("bg30", ours, "delivered")
    lines.append(f"| {ours} | delivered fraction in bg30 >= 99.5% | {100 * dl:.2f}% | - | - | "
                 f"{'yes' if dl >= 0.995 else 'no'} |")
    # Straggler cost: the others' time on the iterations the straggler slept before, against the
    # P50 of the other iterations. A call is two bounded phases (incast max: one round each),
    # each closed by tB at worst, so the deadline of a call is 2 tB.
    def strag(algo):
        s = [(fnum(x["ms"]), x.get("straggle") == "1") for x in samples
             if x["env"] == "straggler" and x["algo"] == algo and int(x["bytes"]) == size]
        hit = [t for t, h in s if h]
        calm = sorted(t for t, h in s if not h)
        if not hit or not calm:
            return math.nan, math.nan
        return max(hit), calm[(len(calm) - 1) // 2]

    smax, sp50 = strag(ours)
    tb = get("straggler", ours, "tb_ms")
    rmax, _ = strag("gloo-ring")
    cost = smax - sp50
    lines.append(
        f"| {ours} | 2 s straggler costs the others <= the call's deadline (2 tB) | ours worst {smax:.0f} "
        f"ms on straggled iterations (others' P50 {sp50:.0f}, cost {cost:.0f} ms, tB {tb:.0f} ms "
        f"per phase); Gloo ring worst {rmax:.0f} ms | {rmax / smax:.1f}x lower | - | "
        f"{'yes' if cost <= 2 * tb else 'no'} |")
    return lines


def headroom_plot(out, by, sweep):
    """bg30 at each headroom: delivered fraction against P99, with the goals drawn in."""
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
    ax.set_xlabel("P99 (ms), bg30")
    ax.set_ylabel("delivered (%)")
    ax.set_title("OPTIREDUCE_TIMEOUT_HEADROOM: P99 against delivered")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "headroom.png"), dpi=110)
    plt.close(fig)


def main(out):
    rows = read(os.path.join(out, "results.csv"))
    samples = read(os.path.join(out, "samples.csv"))
    if not rows:
        sys.exit("report.py: no results.csv in " + out)
    # One size per figure: the largest measured (the driver runs one by default).
    size = max(int(r["bytes"]) for r in rows)
    rows = [r for r in rows if int(r["bytes"]) == size]
    envs = [e for e in ENV_ORDER if any(r["env"] == e for r in rows)]
    envs += sorted({r["env"] for r in rows} - set(envs))
    # bg30 again at other OPTIREDUCE_TIMEOUT_HEADROOM values (run-lab.sh HEADROOMS): a sweep of
    # one knob, plotted on its own, not an environment.
    sweep = [e for e in envs if e.startswith("bg30-h")]
    plain = [e for e in envs if e not in sweep]
    algos = [a for a in STYLE if any(r["algo"] == a for r in rows)]
    by = {(r["env"], r["algo"]): r for r in rows}

    # Latency CDF per environment.
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
        ax.set_title(f"{env}: {size / 2**20:g} MiB fp32, latency CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"cdf-{env}.png"), dpi=110)
        plt.close(fig)

    # P99 and P99/P50 against environment.
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
    fig.savefig(os.path.join(out, "p99-vs-env.png"), dpi=110)
    plt.close(fig)
    if sweep:
        headroom_plot(out, by, sweep)

    # Headline: ratios against Gloo ring and against the best baseline in the same run.
    def get(env, algo, col):
        r = by.get((env, algo))
        return fnum(r[col]) if r else math.nan

    def best(env, col):
        vals = [(get(env, b, col), b) for b in BASELINES if not math.isnan(get(env, b, col))]
        return min(vals) if vals else (math.nan, "-")

    lines = []
    lines.append("| ours | goal | measured | ratio vs Gloo ring | vs best baseline | met |")
    lines.append("|---|---|---|---|---|---|")
    for ours in [o for o in OURS_ALL if any(r["algo"] == o for r in rows)]:
        lines += headline_rows(ours, get, best, samples, size)
    table = "\n".join(lines)

    full = ["| env | algo | P50 ms | P99 ms | P99.9 ms | mean ms | P99/P50 | busbw GB/s | "
            "delivered | rel. L2 err | deadline frac |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in envs:
        for a in algos:
            r = by.get((e, a))
            if not r:
                continue
            full.append(
                f"| {e} | {a} | {fnum(r['p50_ms']):.1f} | {fnum(r['p99_ms']):.1f} | "
                f"{fnum(r['p999_ms']):.1f} | {fnum(r['mean_ms']):.1f} | {fnum(r['p99_p50']):.2f} "
                f"| {fnum(r['busbw_gbs']):.3f} | {fnum(r['delivered']):.4f} | "
                f"{fnum(r['rel_l2_err']):.1e} | {fnum(r['deadline_frac']):.2f} |")
    cal = read(os.path.join(out, "calibration.csv"))
    caltab = ["| level | background | Gloo ring P50 ms | P99 ms | P99/P50 |", "|---|---|---|---|---|"]
    for r in cal:
        caltab.append(f"| {r['level']} | {r['background']} | {fnum(r['p50_ms']):.1f} | "
                      f"{fnum(r['p99_ms']):.1f} | {fnum(r['p99_p50']):.2f} |")
    with open(os.path.join(out, "headline.md"), "w") as f:
        f.write(f"Size {size / 2**20:g} MiB fp32.\n\n" + table + "\n\n")
        f.write("\n".join(full) + "\n\n")
        if cal:
            f.write("Calibration (Gloo ring):\n\n" + "\n".join(caltab) + "\n")
    print(table)
    print()
    print("\n".join(full))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results")
