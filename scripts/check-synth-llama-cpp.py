#!/usr/bin/env python3
"""Check that llama.cpp loads the synthetic models of real shapes.

For each shape (`pensieve-gguf synth FILE --shape S --layers N --type T`):
llama.cpp (llama-cpp-python) loads the file and reports its dimensions;
English sentences and a ChatML prompt (rendered by our template, special
tokens parsed) tokenize to the same ids in both tokenizers; llama.cpp
generates a few greedy tokens; and, with --generate, the most likely next
token after every prompt position (teacher forcing) is compared with
pensieve-generate --top1 on the same ids. Random weights give flat logits
(top-2 gaps far below one logit), and llama.cpp rounds the activations of
quantised products to 8 bits, so top-1 agreement is reported, not judged.
Exit status 0 when every shape loads with the expected dimensions and every
text tokenizes alike.

Not run by make check: it needs llama-cpp-python, which it does not install.
  python3 -m venv /work/venv-llama && CMAKE_ARGS="-DGGML_NATIVE=OFF
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    /work/venv-llama/bin/pip install llama-cpp-python
  /work/venv-llama/bin/python scripts/check-synth-llama-cpp.py \\
    --tool _build/models/pensieve-gguf --generate _build/apps/pensieve-generate
"""
import argparse
import os
import subprocess
import sys
import tempfile

SHAPES = {
    # name: (embedding width, heads, kv heads, vocabulary, context, untied output)
    "llama3-8b": (4096, 32, 8, 128256, 8192, True),
    "qwen2.5-1.5b": (1536, 12, 2, 151936, 32768, False),
    "smollm2-135m": (576, 9, 3, 49152, 8192, False),
}

TEXTS = [
    "The people who work here are very good at their jobs, and they help us understand the world.",
    "I think that this is one of the most important questions we can ask.",
    "Hello, world! It's 2024: numbers 3.14159 and 1,000,000; don't stop.",
    "  leading spaces\tand tabs\nnew lines\n\nand a caf\u00e9 na\u00efve r\u00e9sum\u00e9",
]


def pensieve(tool, cmd, model, text):
    """Run a pensieve-gguf command that reads one hex line from stdin."""
    out = subprocess.run([tool, cmd, model], input=text.encode().hex() + "\n",
                         check=True, capture_output=True, text=True).stdout
    return out.strip()


def chat_prompt(tool, model, user):
    """One user turn rendered by our chat template, with the generation prompt."""
    line = "user\t" + user.encode().hex() + "\n"
    out = subprocess.run([tool, "chat", model], input=line, check=True, capture_output=True,
                         text=True).stdout.strip()
    return bytes.fromhex(out).decode()


def check_shape(args, shape, path):
    from llama_cpp import Llama
    import numpy as np

    print(f"\n## {shape}: {args.layers} layers, {args.type}\n")
    subprocess.run([args.tool, "synth", path, "--shape", shape, "--layers", str(args.layers),
                    "--type", args.type], check=True)
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True,
                n_threads=args.threads, verbose=False)
    embd, heads, kv_heads, vocab, ctx, untied = SHAPES[shape]
    md = llm.metadata
    dims = (llm.n_embd(), int(md["llama.attention.head_count"]),
            int(md["llama.attention.head_count_kv"]), llm.n_vocab(), llm._model.n_ctx_train(),
            int(md["llama.block_count"]))
    print(f"llama.cpp loads it: n_embd {dims[0]}, heads {dims[1]}/{dims[2]}, vocab {dims[3]}, "
          f"n_ctx_train {dims[4]}, layers {dims[5]}, rope base {md['llama.rope.freq_base']}, "
          f"eps {md['llama.attention.layer_norm_rms_epsilon']}, "
          f"{'untied' if untied else 'tied'} output")
    failures = 0
    if dims != (embd, heads, kv_heads, vocab, ctx, args.layers):
        print(f"DIMENSIONS DIFFER: expected {(embd, heads, kv_heads, vocab, ctx, args.layers)}")
        failures += 1

    prompts = [(t, False) for t in TEXTS] + [(chat_prompt(args.tool, path, TEXTS[0]), True)]
    for text, special in prompts:
        ours = [int(x) for x in pensieve(args.tool, "tokenize-special" if special else "tokenize",
                                         path, text).split()]
        theirs = llm.tokenize(text.encode(), add_bos=False, special=special)
        same = ours == theirs
        failures += not same
        shown = text.replace("\n", "\\n")[:60]
        print(f"{'same' if same else 'DIFFERENT'}: {len(ours)} tokens "
              f"({len(text.encode()) / max(len(ours), 1):.1f} bytes each) "
              f"{'chat ' if special else ''}'{shown}'")
        if not same:
            print(f"  ours   {ours}\n  theirs {theirs}")

    ids = llm.tokenize(TEXTS[0].encode(), add_bos=False)
    llm.reset()
    out = llm(TEXTS[0], max_tokens=args.n_predict, temperature=0.0)
    print(f"llama.cpp greedy, {args.n_predict} tokens: {out['choices'][0]['text']!r}")
    if args.generate:
        top = subprocess.run([args.generate, "--model", path, "--prompt", TEXTS[0], "--top1"],
                             check=True, capture_output=True, text=True).stdout
        lines = dict(line.split(":", 1) for line in top.splitlines() if ":" in line)
        mine = [int(x) for x in lines["top1"].split()]
        llm.reset()
        llm.eval(ids)
        ref = np.argmax(np.asarray(llm.scores[: len(ids)]), axis=1).tolist()
        agree = sum(int(a == b) for a, b in zip(mine, ref))
        scores = np.sort(np.asarray(llm.scores[: len(ids)]), axis=1)
        gap = float(np.median(scores[:, -1] - scores[:, -2]))
        print(f"top-1 after each of {len(ids)} prompt positions, pensieve-generate vs llama.cpp: "
              f"{agree}/{len(ids)} agree (median top-2 gap {gap:.3f} logits)")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", required=True, help="the built models/pensieve-gguf")
    ap.add_argument("--generate", help="the built apps/pensieve-generate (top-1 comparison)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=8)
    ap.add_argument("--dir", help="where the files go (default: a temporary directory)")
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            path = os.path.join(args.dir or tmp, f"synth-{shape}-{args.type}.gguf")
            failures += check_shape(args, shape, path)
            if not args.dir:
                os.unlink(path)
    print(f"\n{'all shapes load and tokenize alike' if not failures else f'{failures} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
