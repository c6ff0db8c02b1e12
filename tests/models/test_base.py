"""What every model session offers: a verification's ranks (`fed_ranks`)."""

import torch

from speccap.decoding.verify import cloud_ranks
from speccap.models.base import fed_ranks


def test_a_steps_verifications_ranked_at_once_get_what_each_gets_alone():
    """`fed_ranks` over several verifications at once: each fed token's rank under the row before it
    (the first under the row given), the same as each alone and as `cloud_ranks` on the rows; ties
    (whole-number logits) included."""
    g = torch.Generator().manual_seed(0)
    asks = []
    for n in (1, 4, 2, 6):
        rows = torch.randint(0, 5, (n + 1, 40), generator=g).float()  # many ties
        fed = torch.randint(0, 40, (n,), generator=g).tolist()
        asks.append((rows[0], rows[1:], fed))
    together = fed_ranks(*map(list, zip(*asks)))
    for (before, logits, fed), ranks in zip(asks, together):
        assert ranks == fed_ranks([before], [logits], [fed])[0] == cloud_ranks(torch.cat([before[None], logits]), fed)
