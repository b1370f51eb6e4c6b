"""Markdown tables (speed, memory, accuracy) of bench JSON files, for docs/benchmarks.md.

python benchmarks/tables.py benchmarks/results/bench-*.json
"""

import json
import os
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from gmts_analysis.run.bench import format_table

files = sys.argv[1:]
parts = []
for f in files:
    r = json.load(open(f))
    m = r["machine"]
    models = "; ".join(f"`{k}`: {v['label']} ({v['n_params'] / 1e6:.1f}M params)" for k, v in r["models"].items())
    acc = r["accuracy"]
    lines = [
        f"### {', '.join(r['models'])} — `{os.path.basename(f)}`",
        "",
        f"Models: {models}. dtype {r['dtype']}, prompt {r['prompt_len']} tokens, answers sampled from the model.",
        f"Machine: {m['cpu']}, {m['cpu_count']} cores, torch {m['torch']} with {m['torch_threads']} thread(s), device {m['device']}; "
        f"1-min load average at the end {m.get('load_avg_1m_at_end', float('nan')):.1f} (shared machine). Wall time {r['wall_seconds'] / 60:.1f} min.",
        f"Peak memory: {r['memory_method']}.",
        "",
        format_table(r),
        "",
        "| model | T | exact max rel err vs loop | vs naive | sketch K: Spearman vs exact / 95% coverage |",
        "|---|---:|---:|---:|---|",
    ]
    for a in acc:
        ks = sorted(int(k[6:].split("_")[0]) for k in a if k.startswith("sketch") and k.endswith("_spearman"))
        sk = "; ".join(f"K={k}: {a[f'sketch{k}_spearman']:.3f} / {a[f'sketch{k}_coverage']:.3f}" for k in ks)
        lines.append(
            f"| {a['model']} | {a['T']} | {a['exact_max_rel_err_vs_loop']:.1e} | {a['exact_max_rel_err_vs_naive']:.1e} | {sk} |"
        )
    parts.append("\n".join(lines))
print("\n\n".join(parts))
