#!/usr/bin/env python3
"""Check Pensieve-C's forward pass against llama.cpp (llama-cpp-python) on the
same GGUF file, and time llama.cpp for docs/PERFORMANCE.md.

For each prompt: the token ids Pensieve-C feeds the model, the top-1 next
token after every prompt position (teacher forcing, both fed the same ids),
and a greedy continuation of 32 tokens. Then llama.cpp's prefill and decode
tokens/s with the same shapes bench-model uses.

Not run by make check: it needs the model (scripts/get-model) and
llama-cpp-python, which it does not install. Set one up with
  python3 -m venv /tmp/venv-ref && /tmp/venv-ref/bin/pip install llama-cpp-python
and run it with that interpreter from the build directory:
  /tmp/venv-ref/bin/python ../scripts/compare-llama-cpp.py --generate apps/pensieve-generate
"""
import argparse
import os
import subprocess
import sys
import time

PROMPTS = [
    (True, "What is the capital of France?"),
    (True, "Write a haiku about the sea."),
    (True, "Explain in two sentences why the sky is blue."),
    (False, "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"),
    (False, "def fibonacci(n):\n    if n < 2:\n        return n\n"),
    (True, "Translate to French: I would like a cup of coffee, please."),
]


def default_model():
    base = os.environ.get("PV_MODEL_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "pensieve", "models")
    return os.path.join(base, "SmolLM2-135M-Instruct.Q4_1.gguf")


def ours(gen, model, backend, chat, text, extra):
    cmd = [gen, "--model", model, "--backend", backend, "--prompt", text] + extra
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    lines = {}
    for line in out.splitlines():
        key, _, rest = line.partition(":")
        lines[key] = [int(x) for x in rest.split()]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--generate", default="apps/pensieve-generate")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=32)
    args = ap.parse_args()

    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=args.model, n_ctx=2048, n_batch=512, logits_all=True,
                n_threads=args.threads, verbose=False)
    end_ids = {llm.token_eos()}
    im_end = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
    if len(im_end) == 1:
        end_ids.add(im_end[0])

    total = agree = 0
    greedy_same = 0
    print("| prompt | tokens (ours = llama.cpp tokenizer) | top-1 agreement | greedy 32 identical |")
    print("| --- | --- | --- | --- |")
    for chat, text in PROMPTS:
        top = ours(args.generate, args.model, args.backend, chat, text, ["--top1"])
        ids = top["prompt"]
        # llama.cpp's own tokenization of the same text (the chat form is
        # compared only through ids, since the template is applied by us).
        same_tok = "-"
        if not chat:
            theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
            same_tok = "yes" if theirs == ids else "NO"
        llm.reset()
        llm.eval(ids)
        ref_top = np.argmax(np.asarray(llm.scores[: len(ids)]), axis=1).tolist()
        n_agree = sum(int(a == b) for a, b in zip(top["top1"], ref_top))
        total += len(ids)
        agree += n_agree

        gen = ours(args.generate, args.model, args.backend, chat, text, ["--ids", "-n", "32"])
        mine = gen.get("generated", [])
        ref = []
        llm.reset()
        llm.eval(ids)
        while len(ref) < 32:
            nxt = int(np.argmax(np.asarray(llm.scores[llm.n_tokens - 1])))
            if nxt in end_ids:
                break
            ref.append(nxt)
            llm.eval([nxt])
        same = mine == ref
        greedy_same += int(same)
        short = text.replace("\n", " ")[:40]
        print(f"| {'chat: ' if chat else ''}{short} | {len(ids)} ({same_tok}) | "
              f"{n_agree}/{len(ids)} | {'yes' if same else 'NO'} ({len(ref)} tokens) |")
        if not same:
            print(f"<!-- ours {mine}\n     llama.cpp {ref} -->")
    print(f"\ntop-1 agreement: {agree}/{total} = {100.0 * agree / total:.2f}%; "
          f"greedy continuations identical: {greedy_same}/{len(PROMPTS)}")

    # llama.cpp speed with bench-model's shapes: one prefill batch, then
    # single-token decode steps; logits only where needed, like bench-model.
    n_vocab = llm.n_vocab()
    llm = Llama(model_path=args.model, n_ctx=2048, n_batch=512, n_threads=args.threads,
                verbose=False)
    ids = [(i * 7919 + 13) % n_vocab for i in range(args.prompt_tokens + args.decode_tokens)]
    pre, dec = [], []
    for _ in range(4):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids[: args.prompt_tokens])
        t1 = time.perf_counter()
        for t in ids[args.prompt_tokens:]:
            llm.eval([t])
        t2 = time.perf_counter()
        pre.append(t1 - t0)
        dec.append((t2 - t1) / args.decode_tokens)
    pre, dec = sorted(pre[1:]), sorted(dec[1:])
    print(f"\nllama.cpp ({args.threads} threads, Q4_1 weights as stored): prefill "
          f"{args.prompt_tokens / pre[1]:.1f} tokens/s, decode {1.0 / dec[1]:.1f} tokens/s "
          f"(median of 3 after a warm-up)")
    return 0 if agree * 100 >= 99 * total and greedy_same == len(PROMPTS) else 1


if __name__ == "__main__":
    sys.exit(main())
