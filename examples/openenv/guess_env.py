"""A multi-turn text game served with OpenEnv (`pip install openenv-core`): guess the number.

openenv-core ships no environment of its own (they live in the OpenEnv repository and its
Docker images), so this one is written against its documented API: an ``Environment``
with pydantic ``Action`` / ``Observation`` / ``State`` types behind ``create_fastapi_app``.
Nothing here knows about swarmjax; any OpenEnv client plays it:

    python -m uvicorn guess_env:app --port 8000        # then GenericEnvClient("http://127.0.0.1:8000")

``reset(seed=, high=, tries=)`` picks a number in [1, high]; each step's ``text`` is read
for its first integer and answered "too low", "too high" or "correct" (reward 1, done);
the episode ends after ``tries`` guesses.
"""

from __future__ import annotations

import random
import re
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field


class GuessAction(Action):
    text: str = Field(..., description="the player's turn")


class GuessObservation(Observation):
    text: str = Field(default="", description="what the game says")


class GuessState(State):
    secret: int = 0
    high: int = 8
    tries: int = 4


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, high: int = 8, tries: int = 4,
              **kwargs: Any) -> GuessObservation:
        secret = random.Random(seed).randint(1, high)
        self._state = GuessState(episode_id=episode_id, step_count=0, secret=secret, high=high, tries=tries)
        return GuessObservation(text=f"I picked a number from 1 to {high}. Guess it in {tries} tries.",
                                done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        s = self._state
        s.step_count += 1
        found = re.search(r"\d+", action.text)
        if found is None:
            text, reward, done = "Say a number.", 0.0, False
        elif int(found.group()) == s.secret:
            text, reward, done = f"{s.secret} is correct!", 1.0, True
        else:
            guess = int(found.group())
            text, reward, done = f"{guess} is too {'low' if guess < s.secret else 'high'}.", 0.0, False
        if not done and s.step_count >= s.tries:
            text, done = f"{text} No tries left.", True
        return GuessObservation(text=text, done=done, reward=reward)

    @property
    def state(self) -> GuessState:
        return self._state


app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=256)

SIZES = {"train": 2048, "validation": 64, "test": 64}
SEEDS = {"train": 0, "validation": 10_000, "test": 20_000}


def problems(split: str) -> list[dict]:
    """Each episode's reset arguments."""
    return [{"seed": SEEDS[split] + i, "high": 8, "tries": 4} for i in range(SIZES[split])]
