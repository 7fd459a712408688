#!/usr/bin/env python3
"""Check Pensieve-C's forward pass against llama.cpp (llama-cpp-python) on the
same GGUF file, and time llama.cpp for docs/PERFORMANCE.md.

For each prompt: the token ids Pensieve-C feeds the model, the top-1 next
token after every prompt position (teacher forcing, both fed the same ids),
and a greedy continuation of 32 tokens. Then llama.cpp's prefill and decode
tokens/s with the same shapes bench-model uses.

First our own two weight paths on each file: the weights kept as stored
(--weights native, the default: fused quantised kernels) against the same
weights widened to f32 at load (--weights f32): teacher-forced top-1
agreement (at least 99% on Q4_1) and greedy continuations (identical on the
F32 copy, where both paths multiply the same f32 numbers).

Then llama.cpp, twice. On the file as stored (Q4_1), llama.cpp quantises the
activations to 8 bits for its quantised matrix products, so near-ties (top-2
gaps of 0.01-0.1 logits) flip and a flip changes the rest of a greedy
continuation; that pass is reported, not judged. The judged pass uses an F32
copy that llama.cpp itself writes from the same file (llama_model_quantize to
ALL_F32: exact dequantisation), so both engines multiply the same weights in
f32 arithmetic.

Not run by make check: it needs the model (scripts/get-model) and
llama-cpp-python, which it does not install. Set one up with
  python3 -m venv /tmp/venv-ref && /tmp/venv-ref/bin/pip install llama-cpp-python
(on CPUs with AMX, Debian 12's GCC miscompiles ggml's AMX path: build with
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" and
--no-binary llama-cpp-python) and run it with that interpreter from the build
directory:
  /tmp/venv-ref/bin/python ../scripts/compare-llama-cpp.py --generate apps/pensieve-generate
With --bench-model bench/bench-model the timings run alternately with
bench-model on the same files and shapes, and the table gives the ratios.
Both engines' K/V caches hold the same type in the timings: --kv, f16 by
default as in llama.cpp (Pensieve-C's own default is f32).
"""
import argparse
import os
import subprocess
import sys
import tempfile
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


def f32_copy(src, dst):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.pure = True
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize could not write {dst}")


def check(args, model, label):
    """Top-1 agreement and greedy continuations on one file; returns
    (agreeing positions, positions, identical continuations)."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=2048, n_batch=512, logits_all=True,
                n_threads=args.threads, verbose=False)
    end_ids = {llm.token_eos()}
    im_end = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
    if len(im_end) == 1:
        end_ids.add(im_end[0])

    total = agree = greedy_same = 0
    print(f"\n{label}\n")
    print("| prompt | tokens (ours = llama.cpp tokenizer) | top-1 agreement | greedy 32 identical |")
    print("| --- | --- | --- | --- |")
    for chat, text in PROMPTS:
        top = ours(args.generate, model, args.backend, chat, text, ["--top1"])
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

        gen = ours(args.generate, model, args.backend, chat, text, ["--ids", "-n", "32"])
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
    print(f"\ntop-1 agreement: {agree}/{total} = {100.0 * agree / total:.2f}%; "
          f"greedy continuations identical: {greedy_same}/{len(PROMPTS)}")
    return agree, total, greedy_same


def self_check(args, model, label):
    """Our --weights native against our --weights f32 on one file; returns
    (agreeing positions, positions, identical continuations)."""
    total = agree = greedy_same = 0
    print(f"\n{label}\n")
    print("| prompt | top-1 agreement | greedy 32 identical |")
    print("| --- | --- | --- |")
    for chat, text in PROMPTS:
        top = {w: ours(args.generate, model, args.backend, chat, text, ["--top1", "--weights", w])
               for w in ("native", "f32")}
        n = len(top["f32"]["top1"])
        n_agree = sum(int(a == b) for a, b in zip(top["native"]["top1"], top["f32"]["top1"]))
        gen = {w: ours(args.generate, model, args.backend, chat, text, ["--ids", "-n", "32", "--weights", w])
               for w in ("native", "f32")}
        same = gen["native"].get("generated", []) == gen["f32"].get("generated", [])
        total += n
        agree += n_agree
        greedy_same += int(same)
        short = text.replace("\n", " ")[:40]
        print(f"| {'chat: ' if chat else ''}{short} | {n_agree}/{n} | {'yes' if same else 'NO'} |")
    print(f"\ntop-1 agreement: {agree}/{total} = {100.0 * agree / total:.2f}%; "
          f"greedy continuations identical: {greedy_same}/{len(PROMPTS)}")
    return agree, total, greedy_same


def timing(args, model, label):
    """llama.cpp speed with bench-model's shapes: one prefill batch, then
    single-token decode steps; logits only where needed, like bench-model."""
    import llama_cpp
    from llama_cpp import Llama

    kv_type = llama_cpp.GGML_TYPE_F16 if args.kv == "f16" else llama_cpp.GGML_TYPE_F32
    llm = Llama(model_path=model, n_ctx=2048, n_batch=512, n_threads=args.threads,
                type_k=kv_type, type_v=kv_type, verbose=False)
    n_vocab = llm.n_vocab()
    ids = [(i * 7919 + 13) % n_vocab for i in range(args.prompt_tokens + args.decode_tokens)]
    pre, dec = [], []
    for _ in range(6):
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
    prefill, decode = args.prompt_tokens / pre[2], 1.0 / dec[2]
    print(f"llama.cpp ({args.threads} threads, {label}, K/V {args.kv}): prefill "
          f"{prefill:.1f} tokens/s, decode {decode:.1f} tokens/s "
          f"(median of 5 after a warm-up)")
    return prefill, decode


def ours_timing(args, model, label):
    """bench-model on the same file and shapes (single-stream decode)."""
    import json
    cmd = [args.bench_model, "--model", model, "--backend", args.backend,
           "--prompt", str(args.prompt_tokens), "--decode", str(args.decode_tokens),
           "--reps", "5", "--batch", "1", "--kv", args.kv, "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    print(f"Pensieve-C ({args.backend}, {label}, K/V {args.kv}): prefill {r['prefill_tps']:.1f} tokens/s, "
          f"decode {r['decode_tps']:.1f} tokens/s (bench-model, median of 5 after a warm-up)")
    return r["prefill_tps"], r["decode_tps"]


def side_by_side(args, files):
    """llama.cpp and bench-model alternately, --rounds times per file, so both see
    the same minutes of a shared machine; ratios per round."""
    print("\n| file | round | llama.cpp prefill | ours | ratio | llama.cpp decode | ours | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for rnd in range(1, args.rounds + 1):
        for label, model in files:
            lp, ld = timing(args, model, label)
            op, od = ours_timing(args, model, label)
            rows.append(f"| {label} | {rnd} | {lp:.1f} | {op:.1f} | {op / lp:.2f} | {ld:.1f} | {od:.1f} | "
                        f"{od / ld:.2f} |")
    print("\n".join(rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--generate", default="apps/pensieve-generate")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating rounds per file with --bench-model")
    ap.add_argument("--kv", choices=("f16", "f32"), default="f16",
                    help="K/V cache type of both engines in the timings (llama.cpp's default: f16)")
    ap.add_argument("--timing-only", action="store_true",
                    help="only time llama.cpp on the stored file and its F32 copy")
    ap.add_argument("--bench-model", default=None,
                    help="path of bench/bench-model: time it alternately with llama.cpp")
    args = ap.parse_args()

    ok = True
    if not args.timing_only:
        agree, total, _ = self_check(
            args, args.model, "Ours, weights as stored vs widened to f32 (judged: top-1 >= 99%)")
        ok = agree * 100 >= 99 * total
        check(args, args.model, "File as stored (llama.cpp: 8-bit activations; not judged)")
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "model-f32.gguf")
        f32_copy(args.model, copy)
        if not args.timing_only:
            _, _, self_same = self_check(
                args, copy, "Ours on the F32 copy, native vs widened path (judged: greedy identical)")
            agree, total, greedy_same = check(
                args, copy, "F32 copy written by llama.cpp (both engines in f32; judged)")
            ok = (ok and self_same == len(PROMPTS) and agree * 100 >= 99 * total and
                  greedy_same == len(PROMPTS))
        print()
        if args.bench_model:
            side_by_side(args, [("weights as stored", args.model), ("F32 copy", copy)])
        else:
            timing(args, args.model, "weights as stored")
            timing(args, copy, "F32 copy")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
