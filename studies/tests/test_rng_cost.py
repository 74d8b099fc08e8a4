"""studies.rng_cost times the rolled and the unrolled threefry on the same mask, and checks their bits."""
from studies import rng_cost


def test_both_lowerings_are_timed_and_draw_the_same_mask():
    doc = rng_cost.measure(3, (4, 3, 8))
    assert doc["same_bits"] is True
    for name in ("rolled", "unrolled"):
        low, high = doc[name]["ci95_ms"]
        assert 0 < low <= doc[name]["ms"] <= high
