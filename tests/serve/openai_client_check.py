"""The official openai Python client against `paraflow serve`: completions and chat, streaming and
not, errors as the client's exception types. Exits non-zero (an AssertionError) on any mismatch.

Usage: openai_client_check.py --base-url http://127.0.0.1:PORT/v1 --api-key KEY
"""
import argparse

import openai


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=60)

    models = client.models.list()
    model = models.data[0].id
    assert model == "tiny-gpt", models
    retrieved = client.models.retrieve(model)
    assert retrieved.id == model and retrieved.object == "model", retrieved
    assert retrieved.created == models.data[0].created and retrieved.owned_by == "paraflow", retrieved

    whole = client.completions.create(model=model, prompt="the quick", max_tokens=12, temperature=0)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-"), whole
    assert whole.choices[0].finish_reason == "length", whole
    assert whole.usage.prompt_tokens == 9 and whole.usage.completion_tokens == 12, whole.usage
    streamed = "".join(chunk.choices[0].text
                       for chunk in client.completions.create(model=model, prompt="the quick", max_tokens=12,
                                                              temperature=0, stream=True)
                       if chunk.choices)
    assert streamed == whole.choices[0].text, (streamed, whole.choices[0].text)

    messages = [{"role": "system", "content": "Finish the sentence."}, {"role": "user", "content": "the lazy dog"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    assert chat.object == "chat.completion", chat
    assert chat.choices[0].message.role == "assistant", chat
    assert chat.usage.completion_tokens == 10, chat.usage
    pieces, finish_reason, usage = [], None, None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_completion_tokens=10,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish_reason = choice.finish_reason or finish_reason
    assert "".join(pieces) == chat.choices[0].message.content, (pieces, chat)
    assert finish_reason == "length" and usage.completion_tokens == 10, (finish_reason, usage)

    # The client's own penalty and logit_bias parameters: the byte-level model's first greedy byte,
    # banned, never appears; the penalties are taken.
    banned = whole.choices[0].text[0]
    steered = client.completions.create(model=model, prompt="the quick", max_tokens=12, temperature=0,
                                        logit_bias={str(ord(banned)): -100})
    assert banned not in steered.choices[0].text, (banned, steered.choices[0].text)
    penalised = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0,
                                               frequency_penalty=1.0, presence_penalty=0.5)
    assert penalised.usage.completion_tokens >= 1, penalised

    scored = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0,
                                            logprobs=True, top_logprobs=3)
    content = scored.choices[0].logprobs.content
    assert 1 <= len(content) <= 5, scored
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token, entry
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or entry.token.startswith("bytes:"), entry

    # lm-evaluation-harness's loglikelihood request: the prompt scored, one token generated.
    echoed = client.completions.create(model=model, prompt="the quick", max_tokens=1, temperature=0, logprobs=1,
                                       echo=True)
    scores = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith("the quick"), echoed
    assert len(scores.tokens) == 10 and scores.token_logprobs[0] is None, scores
    assert all(value < 0 for value in scores.token_logprobs[1:]), scores

    two = client.completions.create(model=model, prompt="the", max_tokens=5, n=2, seed=7)
    assert sorted(choice.index for choice in two.choices) == [0, 1], two

    # Fields given as None, which the client sends as null ("not set"), those paraflow does not
    # implement among them, and the reply's message sent back as the client dumps it (its
    # refusal, tool_calls, ... null): the same answers as without them. A tool, which would change
    # the answer, is refused naming the field.
    nulls = dict(tools=None, tool_choice=None, response_format=None, functions=None, parallel_tool_calls=None,
                 service_tier=None, seed=None, stop=None, user=None)
    short = [{"role": "user", "content": "the"}]  # the conversation fits the 96-byte context
    reply = client.chat.completions.create(model=model, messages=short, max_tokens=4, temperature=0).choices[0]
    history = short + [reply.message.model_dump(), {"role": "user", "content": "a"}]
    plain_reply = client.chat.completions.create(model=model, messages=history, max_tokens=6, temperature=0)
    null_reply = client.chat.completions.create(model=model, messages=history, max_tokens=6, temperature=0, **nulls)
    assert null_reply.choices[0].message.content == plain_reply.choices[0].message.content, (null_reply, plain_reply)
    null_whole = client.completions.create(model=model, prompt="the quick", max_tokens=12, temperature=0,
                                           suffix=None, best_of=None, echo=None, logprobs=None)
    assert null_whole.choices[0].text == whole.choices[0].text, (null_whole, whole)
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
        raise AssertionError("tools were accepted")
    except openai.BadRequestError as error:
        assert error.body["param"] == "tools", error.body

    try:
        client.completions.create(model=model, prompt="the", max_tokens=0)
        raise AssertionError("max_tokens 0 was accepted")
    except openai.BadRequestError as error:
        assert error.status_code == 400 and error.body["param"] == "max_tokens", error.body
    try:
        client.completions.create(model="no-such-model", prompt="the")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as error:
        assert error.body["code"] == "model_not_found", error.body
    try:
        openai.OpenAI(base_url=args.base_url, api_key="wrong", max_retries=0).models.list()
        raise AssertionError("a wrong API key was accepted")
    except openai.AuthenticationError as error:
        assert error.status_code == 401, error
    print("openai", openai.__version__, "client: completions, chat, streams, errors: ok")


if __name__ == "__main__":
    main()
