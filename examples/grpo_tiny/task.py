"""The toy task: read "a+b=" (operands zero-padded to one width), write the digits of the sum
(zero-padded). Reward: the share of the answer's digits that are right (partial credit, so an
early policy already gets a signal)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PLUS, EQUALS = 10, 11  # tokens 0-9 are the digits
VOCAB = 12


def digits(value: torch.Tensor, width: int) -> torch.Tensor:
    """[n] integers -> [n, width] decimal digits, most significant first."""
    powers = 10 ** torch.arange(width - 1, -1, -1)
    return (value[:, None] // powers) % 10


@dataclass(frozen=True)
class AdditionTask:
    max_operand: int  # operands are drawn from 0..max_operand

    def __post_init__(self) -> None:
        if not 1 <= self.max_operand <= 9999:
            raise ValueError(f"max_operand must be in 1..9999, got {self.max_operand}")

    @property
    def operand_digits(self) -> int:
        return len(str(self.max_operand))

    @property
    def answer_digits(self) -> int:
        return len(str(2 * self.max_operand))

    @property
    def prompt_len(self) -> int:
        return 2 * self.operand_digits + 2

    def sample_operands(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """[count, 2] operands drawn uniformly."""
        return torch.randint(0, self.max_operand + 1, (count, 2), generator=generator)

    def prompts(self, operands: torch.Tensor) -> torch.Tensor:
        """[n, 2] operands -> [n, prompt_len] tokens "a+b="."""
        n = operands.shape[0]
        return torch.cat([digits(operands[:, 0], self.operand_digits),
                          torch.full((n, 1), PLUS),
                          digits(operands[:, 1], self.operand_digits),
                          torch.full((n, 1), EQUALS)], dim=1)

    def answers(self, operands: torch.Tensor) -> torch.Tensor:
        """[n, 2] operands -> [n, answer_digits] the digits of their sum."""
        return digits(operands.sum(dim=1), self.answer_digits)

    def correct_digits(self, operands: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """[n, answer_digits] 1.0 where a completion's digit is right: the per-digit rewards
        (a completion's reward is their mean, in [0, 1])."""
        return (completions == self.answers(operands)).float()
