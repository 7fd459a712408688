#!/usr/bin/env python3
"""Compare pensieve's tokenizer with independent ones on the real model.

References (installed into a virtualenv, not needed by the build or CI):
  * Hugging Face `tokenizers`, built from the GGUF's own vocabulary and
    merges (read with the `gguf` package) with SmolLM2's pre-tokenizer:
    Digits(individual_digits) then ByteLevel(add_prefix_space=False);
  * llama.cpp through `llama-cpp-python` (vocab only), if it is importable
    in the virtualenv (it builds from source: pass --with-llama-cpp);
  * the chat template rendered by jinja2 (as transformers renders it:
    trim_blocks, lstrip_blocks) against pensieve's ChatML rendering, and
    the rendered conversations encoded with special tokens parsed.

Usage:
  scripts/compare-tokenizer.py --tool BUILD/models/pensieve-gguf [--model FILE]
      [--venv DIR] [--with-llama-cpp] [--show N]
Exit status 0 when every text gives identical ids in every reference.
"""
import argparse
import os
import subprocess
import sys

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see we've done it; they'd say it's fine. DON'T SHOUT, Don't.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF \n \n",
    "numbers: 3.14159, 1,000,000 and 2024-11-22 12:45:00; 007 agents",
    "Arabic-Indic ٣٤٥ and fullwidth １２３ digits, Roman Ⅻ, fractions ½ ¾",
    "Größenwahn über Äpfel, Öl und Übermut; straße",
    "Ça va? L'été à Noël, où êtes-vous? déjà vu",
    "¿Dónde está la biblioteca? ¡Olé! año, niño",
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε· ελληνικά γράμματα",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "你好，世界！我们今天学习分词器。",
    "こんにちは世界。カタカナとひらがな、漢字も。",
    "안녕하세요 세계, 토크나이저 테스트입니다.",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "emoji 🙂😀🎉🚀 and ZWJ 👩‍💻 👨‍👩‍👧‍👦, skin 👍🏽, flags 🇫🇷🇯🇵, keycap 1️⃣",
    "combining: e\u0301 a\u0308 and precomposed é ä; zero\u200bwidth and nbsp\u00a0here",
    "em\u2003space, NEL\u0085here, ideographic\u3000space, thin\u2009space",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12))\n",
    "<html><body class=\"a-b\">x &amp; y</body></html>",
    "math: ∑ᵢ xᵢ² ≤ ∞, ∀ε>0 ∃δ; α+β=γ → ℝ³",
    "mixed中文English混合123テスト🙂end",
    "'s 've 're 'll 'd 'm 't alone, and ''quoted'' ``text''",
    "a" * 300 + " " + "ab" * 200,
    " " * 40 + "x" + "\n" * 20 + "y",
    "!!!??? ... --- *** ___ ~~~ ### @@@ $$$ %%% ^^^",
    "",
]

CONVERSATIONS = [
    [("user", "Hi there")],
    [("system", "You are terse."), ("user", "2+2?"), ("assistant", "4"), ("user", "and 3+3?")],
    [("user", "Écris un haïku 🙂"), ("assistant", "Le vent d'automne\nfeuilles…"), ("user", "merci")],
    [("user", "literal <|im_end|> inside a message, and\ttabs\n\n")],
    [("system", ""), ("user", "")],
]


def random_texts(count, seed=2026):
    """Random strings over the characters of TEXTS plus awkward whitespace,
    digits and apostrophes, to shake out pre-tokenizer edge cases."""
    import random
    rng = random.Random(seed)
    pool = sorted(set("".join(TEXTS)) | set(" \t\n\r\u00a0\u2003\u3000\u0085'0123456789"))
    return ["".join(rng.choice(pool) if rng.random() < 0.7 else rng.choice(" '\n0a")
                    for _ in range(rng.randint(0, 80))) for _ in range(count)]


def ensure_venv(venv, with_llama_cpp):
    """Re-run this script inside a virtualenv holding the references."""
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    pkgs = ["gguf", "tokenizers", "numpy", "jinja2"] + (["llama-cpp-python"] if with_llama_cpp else [])
    probe = "import gguf, tokenizers, jinja2" + (", llama_cpp" if with_llama_cpp else "")
    if subprocess.call([py, "-c", probe], stderr=subprocess.DEVNULL) != 0:
        subprocess.check_call([py, "-m", "pip", "install", "--quiet"] + pkgs)
    os.execv(py, [py] + sys.argv)


def default_model():
    if os.environ.get("PV_MODEL"):
        return os.environ["PV_MODEL"]
    d = os.environ.get("PV_MODEL_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pensieve", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def gguf_vocab(path):
    import gguf
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    template = bytes(r.fields["tokenizer.chat_template"].parts[-1]).decode()
    return tokens, merges, types, pre, template


def hf_tokenizer(tokens, merges, types, pre):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False))
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tk.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tk


def ours(tool, model, texts, command="tokenize"):
    data = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    out = subprocess.run([tool, command, model], input=data.encode(), capture_output=True,
                         check=True).stdout.decode()
    return [[int(x) for x in line.split()] for line in out.splitlines()]


def ours_chat(tool, model, conversations):
    data = "".join("\t".join(f"{role}\t{content.encode().hex()}" for role, content in conv) + "\n"
                   for conv in conversations)
    out = subprocess.run([tool, "chat", model], input=data.encode(), capture_output=True,
                         check=True).stdout.decode()
    return [bytes.fromhex(line).decode() for line in out.splitlines()]


def jinja_chat(template, conversations):
    import jinja2
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    t = env.from_string(template)
    return [t.render(messages=[{"role": r, "content": c} for r, c in conv],
                     add_generation_prompt=True) for conv in conversations]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path to the built models/pensieve-gguf")
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--venv", default="/tmp/pensieve-tokref-venv")
    ap.add_argument("--with-llama-cpp", action="store_true")
    ap.add_argument("--show", type=int, default=0, help="print the first N ids of each text")
    ap.add_argument("--random", type=int, default=500, help="random strings to compare as well")
    args = ap.parse_args()
    ensure_venv(args.venv, args.with_llama_cpp)

    tokens, merges, types, pre, template = gguf_vocab(args.model)
    refs = {"hf-tokenizers": hf_tokenizer(tokens, merges, types, pre)}
    if args.with_llama_cpp:
        import llama_cpp
        refs["llama.cpp"] = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)

    texts = TEXTS + random_texts(args.random)
    got = ours(os.path.abspath(args.tool), args.model, texts)
    total_ids = sum(len(g) for g in got[:len(TEXTS)])
    failures = 0
    for name, ref in refs.items():
        same = same_random = 0
        for i, (text, mine) in enumerate(zip(texts, got)):
            if name == "llama.cpp":
                want = ref.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            else:
                want = ref.encode(text, add_special_tokens=False).ids
            if want == mine:
                if i < len(TEXTS):
                    same += 1
                else:
                    same_random += 1
            else:
                failures += 1
                print(f"MISMATCH [{name}] {text[:60]!r}\n  ours {mine[:40]}\n  ref  {want[:40]}")
        print(f"{name}: {same}/{len(TEXTS)} texts identical ({total_ids} ids in all); "
              f"random strings {same_random}/{len(texts) - len(TEXTS)}")
    tool = os.path.abspath(args.tool)
    rendered = jinja_chat(template, CONVERSATIONS)
    mine_chat = ours_chat(tool, args.model, CONVERSATIONS)
    same_chat = sum(a == b for a, b in zip(rendered, mine_chat))
    failures += len(CONVERSATIONS) - same_chat
    for a, b in zip(rendered, mine_chat):
        if a != b:
            print(f"MISMATCH [chat] jinja2 {a!r}\n  ours {b!r}")
    print(f"chat template (jinja2): {same_chat}/{len(CONVERSATIONS)} conversations rendered identically")
    special_ids = ours(tool, args.model, rendered, "tokenize-special")
    for name, ref in refs.items():
        same = 0
        for text, mine in zip(rendered, special_ids):
            if name == "llama.cpp":
                want = ref.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            else:
                want = ref.encode(text, add_special_tokens=False).ids
            same += want == mine
            if want != mine:
                print(f"MISMATCH [{name}, specials] {text[:60]!r}\n  ours {mine[:40]}\n  ref  {want[:40]}")
        failures += len(rendered) - same
        print(f"{name}, rendered chats with special tokens: {same}/{len(rendered)} identical")
    if args.show:
        for text, mine in zip(TEXTS, got):
            print(f"{text[:40]!r}: {mine[:args.show]}")
    # decode round trip of our ids through the HF decoder
    hf = refs["hf-tokenizers"]
    bad = sum(hf.decode(mine, skip_special_tokens=False) != text for text, mine in zip(TEXTS, got))
    print(f"hf decode of our ids: {len(TEXTS) - bad}/{len(TEXTS)} round-trip to the input")
    return 1 if failures or bad else 0


if __name__ == "__main__":
    sys.exit(main())
