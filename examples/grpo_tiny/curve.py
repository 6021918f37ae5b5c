"""The reward curve: as text for the terminal, as a PNG where matplotlib is installed."""

from __future__ import annotations

BAR_WIDTH = 50


def text_curve(rewards: list[float], rows: int = 20) -> str:
    """One row per span of steps (the span's mean reward), a bar scaled to reward 1.0."""
    span = max(1, -(-len(rewards) // rows))
    lines = ["reward (0 to 1) per step, mean over each span of steps:"]
    for start in range(0, len(rewards), span):
        chunk = rewards[start:start + span]
        mean = sum(chunk) / len(chunk)
        label = f"{start + 1}" if len(chunk) == 1 else f"{start + 1}-{start + len(chunk)}"
        lines.append(f"  step {label:>7}  {mean:5.3f} |{'#' * round(mean * BAR_WIDTH)}")
    return "\n".join(lines)


def save_png(rewards: list[float], path: str, title: str) -> str:
    """Writes the curve to `path`; returns what was done, for the log."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("no PNG written: matplotlib is not importable (ferry's Python environment, "
                "scripts/python-env.sh, has it)")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, marker=".")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"reward curve saved to {path}"
