"""GRPO's learning side: group-relative advantages and the policy-gradient loss (KL-free).

Advantages are GRPO's process-supervision form (DeepSeekMath, section 4.1.3): each answer
digit is a step with its own reward (right or wrong), normalized within the prompt's group;
a token's advantage is the sum of the normalized rewards of its step and the steps after it.
With one reward per whole answer instead, the policy here collapsed onto answers that ignore
the operands before it learned anything."""

from __future__ import annotations

import torch

from model import completion_logprobs


def group_advantages(correct: torch.Tensor, group: int) -> torch.Tensor:
    """[n * group, digits] 0/1 per answer digit -> [n * group, digits] advantages."""
    per_prompt = correct.view(-1, group, correct.shape[1])
    mean = per_prompt.mean(dim=1, keepdim=True)
    std = per_prompt.std(dim=1, keepdim=True)
    normalized = ((per_prompt - mean) / (std + 1e-4)).view_as(correct)
    return normalized.flip(1).cumsum(1).flip(1)  # this digit's and every later one's


def policy_loss(model: torch.nn.Module, prompts: torch.Tensor, completions: torch.Tensor,
                advantages: torch.Tensor) -> torch.Tensor:
    """On-policy (one update per batch of samples), so the clipped ratio of PPO is 1 and the
    loss is the plain policy gradient of GRPO without its KL term."""
    return -(advantages * completion_logprobs(model, prompts, completions)).mean()


def supervised_loss(model: torch.nn.Module, prompts: torch.Tensor,
                    answers: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the right answers: the warm-up before RL."""
    return -completion_logprobs(model, prompts, answers).mean()
