"""A small real RL training job: REINFORCE on CartPole-v1 (gymnasium + PyTorch).

    python examples/cartpole/train.py --episodes 150 --out model.pt

Runs on the card rig gives it (CUDA_VISIBLE_DEVICES) when CUDA is available, else on the CPU;
a few seconds on a laptop CPU. Prints its progress and final average return, and writes the
trained policy to --out (relative to the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import torch
from torch import nn


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="cartpole-policy.pt")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {device} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}), "
          f"rig job {os.environ.get('RIG_JOB_ID', '-')}", flush=True)
    env = gym.make("CartPole-v1")
    policy = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2)).to(device)
    optimiser = torch.optim.Adam(policy.parameters(), lr=1e-2)
    returns: list[float] = []
    began = time.monotonic()
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + episode)
        log_probs, rewards = [], []
        done = False
        while not done:
            logits = policy(torch.as_tensor(obs, dtype=torch.float32, device=device))
            dist = torch.distributions.Categorical(logits=logits)
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            obs, reward, terminated, truncated, _ = env.step(int(action.item()))
            rewards.append(float(reward))
            done = terminated or truncated
        # Discounted returns, normalised: the REINFORCE baseline.
        discounted, running = [], 0.0
        for r in reversed(rewards):
            running = r + 0.99 * running
            discounted.insert(0, running)
        g = torch.as_tensor(discounted, device=device)
        g = (g - g.mean()) / (g.std() + 1e-8)
        loss = -(torch.stack(log_probs) * g).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        returns.append(sum(rewards))
        if (episode + 1) % 25 == 0:
            recent = sum(returns[-25:]) / 25
            print(f"episode {episode + 1}: average return {recent:.1f}", flush=True)
    torch.save(policy.state_dict(), args.out)
    final = sum(returns[-25:]) / min(25, len(returns))
    print(json.dumps({"episodes": args.episodes, "final_average_return": round(final, 1),
                      "first_average_return": round(sum(returns[:25]) / min(25, len(returns)), 1),
                      "seconds": round(time.monotonic() - began, 1),
                      "model": os.path.abspath(args.out)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
