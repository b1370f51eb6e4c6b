"""Jobs: the probe job (gmts probe / gmts run), finishing a run directory, sharding over processes, checkpoint series, the engine benchmark."""
