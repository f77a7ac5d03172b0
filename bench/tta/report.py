#!/usr/bin/python3
"""Time-to-accuracy report: reads the runs train.py wrote under DIR/runs/<env>/<exchange>-s<seed>.json
and writes DIR/runs.csv (one row per run), DIR/tta-curves.png (test accuracy against training time, per environment and exchange),
DIR/tta-sweep.png (final accuracy against injected loss, with and without Hadamard), DIR/tta.md
(a README-ready table and the goals) and prints the goals with PASS/FAIL. Further DIRs (other
run-tta.sh invocations, e.g. a second environment list) are read too; the outputs go to the first.
Usage: report.py DIR [DIR...]"""
import glob
import json
import math
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EXCHANGES = ["ddp-gloo", "opti-exact", "opti-bounded", "opti-bounded-ht"]
ENV_ORDER = ["idle", "bg15", "bg30", "loss", "straggler"]
STYLE = {"ddp-gloo": "tab:blue", "opti-exact": "tab:purple", "opti-bounded": "tab:orange",
         "opti-bounded-ht": "tab:red"}
ENV_NAME = {"idle": "idle", "bg15": "background, Gloo P99/P50 ~1.5",
            "bg30": "background, Gloo P99/P50 ~3", "loss": "random loss", "straggler": "straggler"}
# The goals (issue 15), fixed in advance.
TTA_SPEEDUP = 1.7      # time to accuracy vs DDP over Gloo at P99/P50 ~3, library defaults
ACC_PP = 0.5           # final accuracy within this of exact (percentage points)
HT_PP = 0.5            # with Hadamard: accuracy at 5% loss within this of 0% loss
OURS = "opti-bounded-ht"  # bounded mode with the library's default encoding (Hadamard on)


def load(d):
    runs = []
    for p in sorted(glob.glob(os.path.join(d, "runs", "*", "*.json"))):
        try:
            with open(p) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        r["env_dir"] = os.path.basename(os.path.dirname(p))
        runs.append(r)
    return runs


def mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def nan(x):
    return x is None or (isinstance(x, float) and math.isnan(x))


def envs_of(runs):
    es = sorted({r["env_dir"] for r in runs},
                key=lambda e: (ENV_ORDER.index(e) if e in ENV_ORDER else 99,
                               float(e.split("-")[1]) if e.startswith("sweep-") else 0, e))
    return es


def cell(runs, env, ex):
    return [r for r in runs if r["env_dir"] == env and r["summary"]["exchange"] == ex]


def agg(rs):
    s = [r["summary"] for r in rs]
    reached = [x["tta_s"] for x in s if x["tta_s"] is not None]
    return {
        "n": len(s), "reached": len(reached),
        # Mean over the seeds that reached the target; a seed that did not is listed apart.
        "tta": mean(reached) if len(reached) == len(s) else (mean(reached) if reached else None),
        "steps": mean([x["steps_to_target"] for x in s if x["steps_to_target"] is not None]),
        "final": mean([x["final_acc"] for x in s]),
        "p50": median([x["step_p50_ms"] for x in s]), "p99": median([x["step_p99_ms"] for x in s]),
        "lost": mean([x["lost_per_step"] for x in s]),
        "lost_frac": mean([x["lost_fraction"] for x in s]),
        "train_s": mean([x["train_s"] for x in s]),
        # Runs older than these fields give None (shown as "-").
        "cpu": mean([x["cpu_ms_per_step"] for x in s if x.get("cpu_ms_per_step") is not None]),
        "spread": mean([x["replica_spread_max"] for x in s
                        if x.get("replica_spread_max") is not None]),
    }


def fmt(x, spec=".1f", none="-"):
    return none if nan(x) else format(x, spec)


def pp_from(d, ref):
    """`d` percentage points of accuracy that `ref` is above ours, in words: a signed figure
    beside "below" read as a double negative when ours was the higher one."""
    if abs(d) < 0.005:
        return f"the same as {ref}"
    return f"{abs(d):.2f} pp {'below' if d > 0 else 'above'} {ref}"


def plot_curves(runs, envs, path):
    envs = [e for e in envs if not e.startswith("sweep-")]
    if not envs:
        return
    fig, axes = plt.subplots(1, len(envs), figsize=(4.2 * len(envs), 3.6), squeeze=False,
                             sharey=True)
    for ax, env in zip(axes[0], envs):
        for ex in EXCHANGES:
            for i, r in enumerate(sorted(cell(runs, env, ex), key=lambda r: r["summary"]["seed"])):
                ev = r["evals"]
                ax.plot([e["train_s"] for e in ev], [100 * e["acc"] for e in ev],
                        color=STYLE[ex], alpha=1.0 if i == 0 else 0.35,
                        label=ex if i == 0 else None)
        t = runs[0]["summary"]["target"] if runs else 0.85
        ax.axhline(100 * t, color="grey", ls=":", lw=1)
        ax.set_title(ENV_NAME.get(env, env), fontsize=9)
        ax.set_xlabel("training time (s)")
        ax.set_ylim(60, 92)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_points(runs, ex):
    pts = {}
    for r in runs:
        e = r["env_dir"]
        if e.startswith("sweep-") and r["summary"]["exchange"] == ex:
            pts.setdefault(float(e.split("-", 1)[1]), []).append(r["summary"])
    return {p: pts[p] for p in sorted(pts)}


def plot_sweep(runs, path):
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    any_pt = False
    for ex, lab in (("opti-bounded-ht", "bounded + Hadamard"), ("opti-bounded", "bounded")):
        pts = sweep_points(runs, ex)
        if not pts:
            continue
        any_pt = True
        xs = list(pts)
        ys = [100 * mean([s["final_acc"] for s in pts[p]]) for p in xs]
        ax.plot([100 * x for x in xs], ys, "o-", color=STYLE[ex], label=lab)
        # What reached the gradients: the transport repairs what the deadline leaves time for.
        for x, y in zip(xs, ys):
            lf = mean([s["lost_fraction"] for s in pts[x]])
            ax.annotate(f"{100 * lf:.2f}% lost", (100 * x, y), fontsize=7, color=STYLE[ex],
                        textcoords="offset points", xytext=(4, -10 if ex == "opti-bounded" else 6))
    ex_idle = cell(runs, "idle", "opti-exact")
    if ex_idle:
        ax.axhline(100 * mean([r["summary"]["final_acc"] for r in ex_idle]), color=STYLE["opti-exact"],
                   ls="--", lw=1, label="exact, idle")
    if not any_pt:
        plt.close(fig)
        return
    ax.set_xlabel("injected loss (% of datagrams, OPTIREDUCE_FAULT_DROP);\n"
                  "labels: gradient elements lost after repair")
    ax.set_ylabel("final test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def goals(runs):
    out = []
    # 1. Time to accuracy at P99/P50 ~3 vs DDP over Gloo (ratio of the seeds' mean times).
    g = agg(cell(runs, "bg30", "ddp-gloo")) if cell(runs, "bg30", "ddp-gloo") else None
    o = agg(cell(runs, "bg30", OURS)) if cell(runs, "bg30", OURS) else None
    if not g or not o:
        out.append(("time to accuracy >= 1.7x faster than DDP over Gloo at P99/P50 ~3 (" + OURS + ")",
                    "not run", None))
    else:
        if o["reached"] < o["n"]:
            out.append((f"time to accuracy >= {TTA_SPEEDUP}x faster than DDP over Gloo at P99/P50 ~3",
                        f"{OURS} reached the target in {o['reached']}/{o['n']} seeds", False))
        elif g["reached"] < g["n"]:
            out.append((f"time to accuracy >= {TTA_SPEEDUP}x faster than DDP over Gloo at P99/P50 ~3",
                        f"DDP over Gloo reached it in {g['reached']}/{g['n']} seeds, {OURS} in all "
                        f"({o['tta']:.1f} s)", True))
        else:
            ratio = g["tta"] / o["tta"]
            out.append((f"time to accuracy >= {TTA_SPEEDUP}x faster than DDP over Gloo at P99/P50 ~3",
                        f"{ratio:.2f}x ({OURS} {o['tta']:.1f} s, ddp-gloo {g['tta']:.1f} s)",
                        ratio >= TTA_SPEEDUP))
    # 2. Final accuracy within 0.5 pp of exact, every environment where both ran.
    worst = None
    for env in envs_of(runs):
        if env.startswith("sweep-"):
            continue
        ex = cell(runs, env, "opti-exact")
        if not ex:
            continue
        fe = agg(ex)["final"]
        for b in ("opti-bounded", "opti-bounded-ht"):
            c = cell(runs, env, b)
            if not c:
                continue
            d = 100 * (fe - agg(c)["final"])
            if worst is None or d > worst[0]:
                worst = (d, env, b)
    if worst is None:
        out.append((f"final accuracy within {ACC_PP} pp of exact", "not run", None))
    else:
        out.append((f"final accuracy within {ACC_PP} pp of exact (worst environment and exchange)",
                    f"{pp_from(worst[0], 'exact')} ({worst[2]}, {worst[1]})", worst[0] <= ACC_PP))
    # 3. With Hadamard, 5% loss within 0.5 pp of 0% loss.
    pts = sweep_points(runs, "opti-bounded-ht")
    if 0.0 in pts and 0.05 in pts:
        d = 100 * (mean([s["final_acc"] for s in pts[0.0]]) - mean([s["final_acc"] for s in pts[0.05]]))
        out.append((f"with Hadamard, accuracy at 5% loss within {HT_PP} pp of 0% loss",
                    pp_from(d, "0% loss"), d <= HT_PP))
    else:
        out.append((f"with Hadamard, accuracy at 5% loss within {HT_PP} pp of 0% loss", "not run",
                    None))
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    runs = [r for x in sys.argv[1:] for r in load(x)]
    if not runs:
        print(f"report.py: no runs under {d}/runs", file=sys.stderr)
        return 1
    envs = envs_of(runs)
    cols = ["env", "exchange", "seed", "steps_run", "tta_s", "steps_to_target", "final_acc",
            "final_acc_subset", "step_p50_ms", "step_p99_ms", "step_mean_ms", "lost_per_step",
            "lost_fraction", "deadline_hits", "train_s", "wall_s", "cpu_ms_per_step",
            "replica_spread_max", "replica_spread_final", "resyncs"]
    with open(os.path.join(d, "runs.csv"), "w") as f:
        f.write(",".join(cols) + "\n")
        for r in sorted(runs, key=lambda r: (r["env_dir"], r["summary"]["exchange"],
                                             r["summary"]["seed"])):
            x = dict(r["summary"], env=r["env_dir"])
            f.write(",".join("" if x.get(c) is None else
                             (f"{x[c]:.6g}" if isinstance(x[c], float) else str(x[c]))
                             for c in cols) + "\n")
    plot_curves(runs, envs, os.path.join(d, "tta-curves.png"))
    plot_sweep(runs, os.path.join(d, "tta-sweep.png"))
    s0 = runs[0]["summary"]
    seeds = sorted({r["summary"]["seed"] for r in runs})
    lines = [f"Time to {100 * s0['target']:.0f}% test accuracy (Fashion-MNIST, MLP 784-1024-1024-10, "
             f"{s0['world']} ranks x {s0['batch_per_rank']} samples, SGD lr {s0['lr']} momentum "
             f"{s0['momentum']}, budget {s0['step_budget']} steps; seeds {', '.join(map(str, seeds))}; "
             "times are training time, evaluations excluded; means over seeds, step P50/P99 "
             "medians over seeds).", "",
             "| environment | exchange | time to target (s) | vs ddp-gloo | steps to target | "
             "final accuracy | step P50 / P99 (ms) | lost elements per step (fraction) | "
             "replica spread (max) | CPU per step, all ranks (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for env in envs:
        base = cell(runs, env, "ddp-gloo")
        bt = agg(base)["tta"] if base else None
        for ex in EXCHANGES:
            c = cell(runs, env, ex)
            if not c:
                continue
            a = agg(c)
            tta = fmt(a["tta"]) if a["reached"] else "not reached"
            if a["reached"] and a["reached"] < a["n"]:
                tta += f" ({a['reached']}/{a['n']} seeds)"
            ratio = (f"{bt / a['tta']:.2f}x" if not nan(bt) and not nan(a["tta"]) and ex != "ddp-gloo"
                     else "-")
            lost = "-" if ex == "ddp-gloo" else f"{a['lost']:.0f} ({100 * a['lost_frac']:.3f}%)"
            name = env if env.startswith("sweep-") else ENV_NAME.get(env, env)
            if env.startswith("sweep-"):
                name = f"sweep: {100 * float(env.split('-', 1)[1]):g}% injected loss"
            lines.append(f"| {name} | {ex} | {tta} | {ratio} | {fmt(a['steps'], '.0f')} | "
                         f"{100 * a['final']:.2f}% | {fmt(a['p50'])} / {fmt(a['p99'])} | {lost} | "
                         f"{fmt(a['spread'], '.1e')} | {fmt(a['cpu'], '.0f')} |")
    lines += ["", "| goal | measured | verdict |", "|---|---|---|"]
    gl = goals(runs)
    for what, measured, ok in gl:
        lines.append(f"| {what} | {measured} | "
                     f"{'not run' if ok is None else ('PASS' if ok else 'FAIL')} |")
    for x in sys.argv[1:]:
        setup = os.path.join(x, "setup.txt")
        if os.path.exists(setup):
            with open(setup) as f:
                lines += ["", f"Setup ({x}):", "", "```", f.read().rstrip(), "```"]
        knobs = os.path.join(x, "knobs.txt")
        if os.path.exists(knobs):
            with open(knobs) as f:
                lines += ["", "NOT the library's defaults: " + f.read().replace("\n", " ")]
    with open(os.path.join(d, "tta.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:lines.index("| goal | measured | verdict |") - 1]))
    print()
    for what, measured, ok in gl:
        print(f"{'not run' if ok is None else ('PASS' if ok else 'FAIL')}: {what}: {measured}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
