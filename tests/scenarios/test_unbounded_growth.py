"""Failure mode 5, unbounded-growth: the record grows until it no longer fits the context of
the agent that must summarise it."""

from __future__ import annotations

import pytest

import crdtstore
from crdtstore import BudgetExceeded, CollectionSpec

pytestmark = pytest.mark.anyio


async def test_growth_is_a_decision_not_an_accident() -> None:
    context_tokens = 200
    schema = {"findings": CollectionSpec(kind="list", max_bytes=context_tokens * 4)}
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="a", schema=schema) as rec:
            findings = rec.list("findings")
            summarised_at = None
            i = 0
            while True:
                # the summariser is scheduled before the limit, from size(), not after it
                if rec.size()["findings"]["tokens"] > context_tokens * 0.8:
                    summarised_at = i
                    break
                await findings.append(f"finding number {i}: something worth knowing")
                i += 1
            assert summarised_at is not None
            # had nobody looked, the budget refuses the write that would overflow
            refused = None
            for j in range(100):
                try:
                    await findings.append(f"finding number {i + j}: something worth knowing")
                except BudgetExceeded as err:
                    refused = err
                    break
            assert refused is not None
            assert refused.limit == context_tokens * 4
            assert rec.size()["findings"]["bytes"] <= context_tokens * 4
            # summarising makes room: delete what was summarised, append the summary
            n = len(findings)
            await findings.delete(0, n)
            await findings.append(f"summary of {n} findings")
            assert rec.size()["findings"]["tokens"] < 20
