"""Placement search (`schedlab search --space placement`): which device runs each group of
ops. `problem` states the problem every strategy answers; the strategies are the
placement paper's RL grouper-placer (`rl`), Baechi's heuristics (`baechi`), the expert
layer split and Optuna (`strategies`)."""
