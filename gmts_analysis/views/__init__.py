"""Drawing: figures, the HTML report, the notebook view, run comparisons. Views read runs; they never probe."""
