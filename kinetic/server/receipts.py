"""Receipts from the server: `"receipt": true` on /v1/chat/completions and /v1/completions.

Owns: reading the field, refusing what a receipt cannot record yet (stop strings, a grammar, a
response_format, tools: `kinetic verify-receipt` reruns the prompt tokens with the sampling
settings alone), and making the receipt of a finished answer in the format `kinetic run --receipt`
writes (kinetic/receipts: the model's hash, the build, the device class, the prompt tokens, every
sampling setting with the seed actually used, so a request without a seed records the fresh one it
drew, and the output tokens), signed with the server's --sign-key when it has one. The model
file's BLAKE3 and the signature are computed on the CpuPool, never on the event loop.
Does not own the receipt format or its checks (kinetic/receipts), nor where a response carries it
(openai_api.py: a "receipt" member, in the last chunk of a stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kinetic.receipts import Answer, make_receipt
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError
from kinetic.server.options import ServerState
from kinetic.server.worker import Finished, GenerationRequest


@dataclass(frozen=True)
class ReceiptAsk:
    """A request's receipt, asked for: what it records as the input (the messages, the prompt text,
    or None for token ids) and the request's token limit."""

    input: Any
    max_tokens: int | None


def receipt_ask(f: Fields, *, input: Any, max_tokens: int | None, stop: tuple[str, ...],
                held_by: str | None) -> ReceiptAsk | None:
    """None unless the request sets "receipt": true; a 400 naming what a receipt cannot record yet.
    `held_by`: the field that holds the answer to a grammar (response_format, tools, ...), if any."""
    if not f.boolean("receipt", False):
        return None
    if stop:
        raise ApiError(400, "receipt: a receipt cannot record stop strings yet (kinetic verify-receipt reruns "
                            "without them); leave out stop or receipt", param="receipt")
    if held_by is not None:
        raise ApiError(400, f"receipt: a receipt cannot record an answer held by {held_by} yet (kinetic "
                            f"verify-receipt reruns without a grammar); leave out {held_by} or receipt",
                       param="receipt")
    return ReceiptAsk(input, max_tokens)


async def receipt_of(state: ServerState, ask: ReceiptAsk, generation: GenerationRequest, text: str,
                     fin: Finished) -> dict:
    """The receipt of a finished answer (signed with the server's key, if any)."""
    answer = Answer(model_path=state.model.path, device=state.model.engine.device, n_ctx=state.n_ctx,
                    input=ask.input, prompt_ids=list(generation.prompt), sampling=fin.settings,
                    max_tokens=ask.max_tokens, finish=fin.finish_reason, text=text, output_ids=list(fin.tokens),
                    options=state.model.options, adapters=tuple(state.model.adapters))
    return await state.cpu.run(lambda _: make_receipt(answer, state.options.sign_key))
