"""The browser runtime's Hugging Face tokenizers in headless Chromium, each bundle served as
static files (the libraries from the bundle's ``runtime/vendor/`` copies): token ids and text
equal to the Python ``tokenizers`` library's on the corpus (``tests/tokenizer/corpus.json``)
for a byte-level BPE, two SentencePiece-style tokenizers and a WordPiece one; chat prompts equal
to transformers' ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``
for the ChatML-, Llama-3- and Gemma-style templates; and, without the copies, the error that
says so.  One page loads every bundle (on the wasm backend: tokenizers need no GPU).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tokenizers import Tokenizer
from transformers import AutoTokenizer

import relaxweb
from relaxweb import browser
from tests.runtime_js.test_browser import pytestmark  # noqa: F401  (browser; skipped without Playwright or Chromium)
from tests.tokenizer.conversations import REFUSED, RENDERED
from tests.tokenizer.folders import corpus_texts, identity_model, tokenizer_bundles, tokenizer_folders  # noqa: F401
from tests.tokenizer.test_huggingface import TOKENIZERS, streamed

#: Runs in the runner page: each bundle loaded, every text encoded (with and without special
#: tokens), Python's ids decoded (whole, cut before the last token, streamed), each
#: conversation rendered (or its error).
TOKENIZE_IN_PAGE = """
async ({ bundles, texts, decodeIds, conversations }) => {
  const results = {};
  for (const [name, url] of Object.entries(bundles)) {
    const model = await window.relaxweb.load(url, { backend: "wasm" });
    const tokenizer = model.tokenizer;
    const stream = (ids) => {
      const s = tokenizer.stream();
      return ids.map((id) => s.push(id)).join("") + s.finish();
    };
    results[name] = {
      kind: tokenizer.kind,
      ids: texts.map((text) => tokenizer.encode(text)),
      plain: texts.map((text) => tokenizer.encode(text, { addSpecialTokens: false })),
      decoded: (decodeIds[name] ?? []).map((ids) => tokenizer.decode(ids)),
      cut: (decodeIds[name] ?? []).map((ids) => tokenizer.decode(ids.slice(0, -1))),
      streamed: (decodeIds[name] ?? []).map(stream),
      chats: (conversations[name] ?? []).map((messages) => {
        try { return model.applyChatTemplate(messages); } catch (error) { return { error: error.message }; }
      }),
    };
    model.dispose();
  }
  return results;
}
"""


def test_tokenizers_and_chat_templates_in_chromium(tokenizer_folders, tokenizer_bundles) -> None:  # noqa: F811
    root = tokenizer_bundles[next(iter(tokenizer_bundles))]
    urls = {name: "/bundle/" + ("" if path == root else f"{path.relative_to(root)}/") for name, path in tokenizer_bundles.items()}
    texts = corpus_texts()
    references = {name: Tokenizer.from_file(str(tokenizer_folders[name] / "tokenizer.json")) for name in TOKENIZERS}
    plain_ids = {name: [reference.encode(text, add_special_tokens=False).ids for text in texts]
                 for name, reference in references.items()}
    conversations = {name: RENDERED.get(name, []) + [messages for folder, messages, _ in REFUSED if folder == name]
                     for name in RENDERED}
    with browser.open_runner_page(root, timeout_s=120) as page:
        results = page.evaluate(TOKENIZE_IN_PAGE, {"bundles": urls, "texts": texts, "decodeIds": plain_ids,
                                                   "conversations": conversations})

    for name, reference in references.items():
        result = results[name]
        assert result["kind"] == "huggingface"
        for index, text in enumerate(texts):
            assert result["ids"][index] == reference.encode(text).ids, (name, text)
            assert result["plain"][index] == plain_ids[name][index], (name, text)
            ids = plain_ids[name][index]
            assert result["decoded"][index] == reference.decode(ids), (name, text)
            assert result["cut"][index] == reference.decode(ids[:-1]), (name, text)
            # the same stream as the Python runtime's: the decoding of all, a piece at a time
            assert result["streamed"][index] == streamed(reference.decode, ids), (name, text)

    for name, cases in conversations.items():
        transformers_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folders[name]))
        for messages, rendered in zip(cases, results[name]["chats"]):
            refusal = next((message for folder, refused, message in REFUSED if folder == name and refused is messages), None)
            if refusal is None:
                expected = transformers_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                assert rendered == expected, (name, messages)
            else:
                assert rendered == {"error": f"the chat template refused these messages: {refusal}"}, (name, messages)


NO_LIBRARIES_IN_PAGE = """
async () => {
  try { await window.relaxweb.load("/bundle/", { backend: "wasm" }); return null; } catch (error) { return error.message; }
}
"""


def test_without_the_libraries_loading_says_what_to_do(tokenizer_folders, tmp_path: Path) -> None:  # noqa: F811
    bundle = relaxweb.build(identity_model(), tmp_path / "bundle", tokenizer=tokenizer_folders["wordpiece"]).path
    shutil.rmtree(bundle / "runtime" / "vendor")  # as a build without the npm packages installed leaves it
    with browser.open_runner_page(bundle, timeout_s=60) as page:
        message = page.evaluate(NO_LIBRARIES_IN_PAGE)
    assert message is not None and message.startswith(
        "this bundle's tokenizer needs @huggingface/tokenizers, and it could not be imported: not by its name (")
    assert "nor from the bundle's copy http://127.0.0.1:" in message and "/runtime/vendor/tokenizers.mjs (" in message
    assert message.endswith("'relaxweb build' copies it where 'npm install @huggingface/tokenizers' has put it in "
                            "node_modules)")
