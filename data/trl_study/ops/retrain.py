"""Train a recorded run of the study again (its checkpoints were lost with the machine) for the audit, and check
that the new training is the recorded one: every step's training log (reward, loss, grad norm, entropy, lengths)
equal to the record's. Same driver function, same plan, same commit, same thread count.

    python ops/retrain.py all-s1000
"""
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, "/work/study37wt/benchmarks")
import trl_study as D  # noqa: E402
from gmts_analysis.integrations.trl_train import checkpoint_dirs, prune_finished_run  # noqa: E402
from gmts_analysis.readers.trl_output import trainer_log  # noqa: E402
from gmts_analysis.rl.trl_records import trl_steps  # noqa: E402
from gmts_analysis.rl.referee_plan import load_plan  # noqa: E402
from gmts_analysis.sampling.generate import read_prompts  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
name = sys.argv[1]
arm, seed = name.split("-s")
plan_path = Path("data/trl_study/plan.json")
plan = load_plan(plan_path)
trl = plan["trl"]
rows = read_prompts(plan_path.parent / trl["eval"]["prompts"])
targs = D.check_plan(plan, plan_path, rows)["rho0.2_batch"]
run_dir = Path("/work/study37/runs/rho0.2_batch") / name
seg = D.train(run_dir, trl, arm, int(seed), 1, targs)
rec = json.loads(Path(f"data/trl_study/rho0.2_batch.runs/{name}.json").read_text())
new = trl_steps(trainer_log(checkpoint_dirs(run_dir)[-1][1]))
diffs = []
for a, b in zip(rec["steps"], new):
    for k, v in a.items():
        if k in ("step_s",):
            continue
        if b.get(k) != v:
            diffs.append((a["step"], k, v, b.get(k)))
same = len(rec["steps"]) == len(new) and not diffs
out = {"run": name, "retrain_wall_s": round(seg, 1), "steps": len(new), "identical_to_record": same,
       "differences": diffs[:50]}
Path(f"/work/study37wt/ops/retrain_{name}.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out)[:2000])
prune_finished_run(run_dir, trl.get("keep_checkpoints"))
print("kept", [s for s, _ in checkpoint_dirs(run_dir)])
