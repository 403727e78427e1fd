"""The trainer example (envs/train/): TRL driven by snapgym episodes."""
