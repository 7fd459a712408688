"""pensieve-serve through the official openai Python client: models, a chat
completion, streaming with usage, sessions by prompt_cache_key and by the
X-Session-Id header (a later turn reuses cached KV and answers as the same
request sent statelessly), logit_bias as the client sends it, bad requests
(logit_bias ones too) refused with 400, and with an API
key a wrong key refused with 401. Prints TAP lines; tests/test-serve-openai.sh
runs it against a server it started. Exits 1 on any failed check."""

import argparse
import inspect
import sys

import openai

from tap_client import Tap

MODEL = "synthetic"


def cached_tokens(usage):
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", None) or 0) if details else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key", default=None, help="the key the server was started with")
    ap.add_argument("--label", default="", help="appended to every description")
    ap.add_argument("--first", type=int, default=None,
                    help="the first test number (no plan printed: the caller prints it)")
    args = ap.parse_args()

    tap = Tap(args.first or 1)
    label = f" ({args.label})" if args.label else ""
    base_url = f"http://127.0.0.1:{args.port}/v1"
    # No retries: a refused request must surface as it is, not be resent.
    client = openai.OpenAI(base_url=base_url, api_key=args.api_key or "none",
                           max_retries=0, timeout=120)
    greedy = dict(model=MODEL, max_tokens=8, temperature=0)
    # prompt_cache_key is a keyword of newer clients; older ones pass it on
    # as an extra body field, which reaches the server the same way.
    has_cache_key = "prompt_cache_key" in inspect.signature(
        client.chat.completions.create).parameters

    def cache_key(key):
        return {"prompt_cache_key": key} if has_cache_key else {"extra_body": {"prompt_cache_key": key}}

    # 1. Models and one completion.
    try:
        ids = [m.id for m in client.models.list().data]
        tap.ok(MODEL in ids, f"GET /v1/models lists {MODEL!r}{label}", f"models: {ids}")
    except Exception:
        tap.error(f"GET /v1/models{label}")

    hello = [{"role": "user", "content": "hello"}]
    content = None
    try:
        r = client.chat.completions.create(messages=hello, **greedy)
        choice = r.choices[0]
        content = choice.message.content
        tap.ok(isinstance(content, str) and choice.message.role == "assistant",
               f"a chat completion has an assistant message with content{label}",
               f"message: {choice.message!r}")
        tap.ok(choice.finish_reason in ("stop", "length"),
               f"finish_reason {choice.finish_reason!r} is stop or length{label}")
        u = r.usage
        tap.ok(u is not None and u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 8 and
               u.total_tokens == u.prompt_tokens + u.completion_tokens,
               f"usage: prompt > 0, completion in [1, 8], total their sum{label}", f"usage: {u!r}")
    except Exception:
        tap.error(f"a chat completion{label}")

    # 2. The same greedy request streamed.
    try:
        chunks = list(client.chat.completions.create(
            messages=hello, stream=True, stream_options={"include_usage": True}, **greedy))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        tap.ok(content is not None and streamed == content,
               f"streamed deltas add up to the non-streamed answer{label}",
               f"streamed {streamed!r}, non-streamed {content!r}")
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        tap.ok(len(reasons) == 1 and reasons[0] in ("stop", "length"),
               f"one streamed chunk carries the finish_reason{label}", f"finish reasons: {reasons}")
        last = chunks[-1] if chunks else None
        tap.ok(last is not None and last.choices == [] and last.usage is not None and
               last.usage.prompt_tokens > 0 and 1 <= last.usage.completion_tokens <= 8,
               f"the last chunk carries usage and no choices{label}", f"last chunk: {last!r}")
    except Exception:
        tap.error(f"a streamed chat completion{label}")

    # 3 and 4. Sessions: turn 2 repeats turn 1 and its answer, so its prompt
    # is served from the KV the session kept; the answer is what the same
    # messages get with no session at all.
    def session_turns(how, session_kwargs):
        first = [{"role": "user", "content": f"Hi, this is a conversation by {how}. Tell me a story."}]
        try:
            r1 = client.chat.completions.create(messages=first, **session_kwargs, **greedy)
            second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                              {"role": "user", "content": "And what happened next?"}]
            r2 = client.chat.completions.create(messages=second, **session_kwargs, **greedy)
            r2s = client.chat.completions.create(messages=second, **greedy)
        except Exception:
            tap.error(f"two turns of a session by {how}{label}")
            return
        c2 = cached_tokens(r2.usage)
        tap.ok(c2 > 0 and c2 <= r2.usage.prompt_tokens,
               f"session by {how}: turn 2 has cached prompt tokens ({c2} of "
               f"{r2.usage.prompt_tokens}){label}", f"usage: {r2.usage!r}")
        tap.ok(r2.choices[0].message.content == r2s.choices[0].message.content,
               f"session by {how}: turn 2 answers as the stateless request{label}",
               f"session {r2.choices[0].message.content!r}, "
               f"stateless {r2s.choices[0].message.content!r}")

    session_turns("prompt_cache_key", cache_key("s1"))
    session_turns("X-Session-Id", {"extra_headers": {"X-Session-Id": "s2"}})

    # 5. logit_bias as the client sends it (a dict of int keys; string keys
    # on the wire): a ban on the greedy answer's first token changes it, and
    # the banned token never comes. token_ids is the server's extension.
    def token_ids(r):
        return list(getattr(r.choices[0], "token_ids", None) or [])

    ids_kwargs = dict(extra_body={"return_token_ids": True, "ignore_eos": True}, **greedy)
    try:
        plain = token_ids(client.chat.completions.create(messages=hello, **ids_kwargs))
        banned = token_ids(client.chat.completions.create(
            messages=hello, logit_bias={plain[0]: -100} if plain else None, **ids_kwargs))
        tap.ok(len(plain) == 8 and len(banned) == 8 and banned[0] != plain[0] and plain[0] not in banned,
               f"logit_bias -100 on the answer's first token gives another first token and never it{label}",
               f"unbiased {plain}, banned {banned}")
    except Exception:
        tap.error(f"logit_bias through the client{label}")

    # 6. Bad requests: 400, and the server goes on answering.
    for desc, kwargs in (("max_tokens 0", dict(model=MODEL, max_tokens=0)),
                         ("temperature 5", dict(model=MODEL, max_tokens=8, temperature=5)),
                         ("logit_bias value 101", dict(model=MODEL, max_tokens=8, logit_bias={5: 101})),
                         ("logit_bias key '01'", dict(model=MODEL, max_tokens=8, logit_bias={"01": 1}))):
        try:
            client.chat.completions.create(messages=hello, **kwargs)
            tap.ok(False, f"{desc} is refused with 400{label}", "the request succeeded")
        except openai.BadRequestError as e:
            tap.ok(e.status_code == 400, f"{desc} is refused with 400{label}", f"status {e.status_code}")
        except Exception:
            tap.error(f"{desc} is refused with 400{label}")
    try:
        r = client.chat.completions.create(messages=hello, **greedy)
        tap.ok(r.choices[0].message.content == content,
               f"the server answers after refusing bad requests{label}")
    except Exception:
        tap.error(f"the server answers after refusing bad requests{label}")

    # 7. A wrong key.
    if args.api_key:
        wrong = openai.OpenAI(base_url=base_url, api_key=args.api_key + "-wrong",
                              max_retries=0, timeout=120)
        try:
            wrong.chat.completions.create(messages=hello, **greedy)
            tap.ok(False, f"a wrong API key is refused with 401{label}", "the request succeeded")
        except openai.AuthenticationError as e:
            tap.ok(e.status_code == 401, f"a wrong API key is refused with 401{label}",
                   f"status {e.status_code}")
        except Exception:
            tap.error(f"a wrong API key is refused with 401{label}")

    if args.first is None:
        print(f"1..{tap.n}")
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
