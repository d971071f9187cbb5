"""A stand-in language model: prefill and decode cost real (sleeping) time proportional to tokens."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class ModelCosts:
    """Seconds per unit of work; the defaults make a 16-token answer take tens of milliseconds."""

    load_s: float = 0.15
    prefill_s_per_token: float = 0.0001
    decode_step_s: float = 0.002
    decode_s_per_sequence: float = 0.0004
    tokenize_s_per_token: float = 0.00001


class StandInModel:
    """Loads once (cold start), then prefills a batch and decodes it one step at a time."""

    def __init__(self, name: str = "example-llm", version: str = "v1", costs: ModelCosts | None = None) -> None:
        self.name = name
        self.version = version
        self.costs = costs or ModelCosts()
        self.loaded = False
        self._vocab = ("the", "tail", "is", "long", "and", "latency", "hides", "in", "decode", "queue")

    def tokenize(self, prompt: str) -> list[str]:
        """Split the prompt into tokens (whitespace words)."""
        return prompt.split() or [""]

    async def load(self) -> None:
        """Bring the weights in: costs `load_s` the first time only."""
        if not self.loaded:
            await asyncio.sleep(self.costs.load_s)
            self.loaded = True

    async def prefill(self, input_tokens: int) -> None:
        """Process the prompts of a batch: time proportional to their total tokens."""
        await asyncio.sleep(self.costs.prefill_s_per_token * input_tokens)

    async def decode_step(self, sequences: int) -> None:
        """One decode step for `sequences` sequences: a fixed cost plus a cost per sequence."""
        await asyncio.sleep(self.costs.decode_step_s + self.costs.decode_s_per_sequence * sequences)

    def token(self, i: int) -> str:
        """The i-th generated token."""
        return self._vocab[i % len(self._vocab)]
