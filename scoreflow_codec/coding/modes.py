"""The coding modes and arithmetics a file may name, and a mode's model evaluations per batch:
what reading and checking a header needs, without the codecs (and torch) behind them."""

MODES = ("ode", "chain")
ARITHMETICS = ("exact64", "float32")
STEPS_RANGE = (2, 4096)  # the solver / chain steps a file, a model file or the CLI may name
TILE_RANGE = (8, 256)    # the tile sizes a model file, a zoo entry or the CLI may name


def steps_per_batch(mode: str, steps: int) -> int:
    """Model evaluations (progress ticks) of one batch: the chain codes steps - 1 transitions, the
    ODE solver takes `steps` steps."""
    return steps - (1 if mode == "chain" else 0)
