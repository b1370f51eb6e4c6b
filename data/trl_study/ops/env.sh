# the study's environment: the worktree's code (fixed commit), main's venv, one thread, the conversion cache
. /work/main/.venv/bin/activate
export PYTHONPATH=/work/study37wt GMTS_CACHE=/work/study37/cache OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
cd /work/study37wt
