"""pass@1 at each evaluated step of every recorded run (ops helper)."""
import glob, json, os
d = "/work/study37wt/data/trl_study/rho0.2_batch.runs"
for f in sorted(glob.glob(f"{d}/*.json")):
    r = json.load(open(f))
    print(f"{os.path.basename(f)[:-5]:14s}", " / ".join(f"{e['pass1_mean']:.3f}" for e in r["evals"]),
          f"train {r['timing_s']['train']:.0f} s, eval {r['timing_s']['eval']:.0f} s")
