//! vLLM 0.33's own renderings (`tests/fixtures/mock/chat_template.json`): every body parsed as
//! the mock and the model parse it, rendered by the one shared function, and tokenized by both
//! the mock (what `usage.prompt_tokens` reports) and the model (its memoised pieces), against
//! the text and ids vLLM produced, or refused with vLLM's message and status.

use std::path::PathBuf;
use std::sync::Arc;

use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::tokens::{self, IsoHint, Memo, Vocab};
use crate::api::Shape;
use crate::mock::tokenize::{render_chat, MockTokenizer};
use crate::synth::tokenizer::pyjinja::TemplateDate;
use crate::synth::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Case {
    name: String,
    tokenizer: String,
    body: Box<RawValue>,
    prompt_text: Option<String>,
    prompt_token_ids: Option<Vec<u32>>,
    num_prompt_tokens: Option<usize>,
    error: Option<String>,
    error_status: Option<u16>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fixture's cases and the Llama 3.2 chat template vLLM was given.
fn load() -> (Vec<Case>, String) {
    let text = std::fs::read_to_string(root().join("tests/fixtures/mock/chat_template.json"))
        .expect("the fixture is in the repository");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(
        v["clock"].as_str().map(|c| c.contains("2025-03-07")),
        Some(true)
    );
    let template = v["tokenizers"]["llama-3.2"]["chat_template_text"]
        .as_str()
        .expect("the header carries the template")
        .to_owned();
    #[derive(Deserialize)]
    struct File {
        cases: Vec<Case>,
    }
    let file: File = serde_json::from_str(&text).expect("cases");
    (file.cases, template)
}

/// A folder holding the Llama 3.2 test tokenizer and `template` as `chat_template.jinja`, as
/// a model folder from the Hub carries it (unique to this test run).
fn llama_folder(template: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kvbust-chat-vectors-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let src = root().join("tests/fixtures/synth/tokenizers/llama-3.2");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copies");
    }
    std::fs::write(dir.join("chat_template.jinja"), template).expect("writes");
    dir
}

/// Every case: the mock's and the model's text and ids equal vLLM's; refusals refused alike.
#[test]
fn every_vector_renders_and_counts_as_vllm() {
    let (cases, template) = load();
    assert_eq!(cases.len(), 50);
    let date = TemplateDate::parse("2025-03-07").expect("a date");
    let dir = llama_folder(&template);
    let llama = Arc::new(Tokenizer::from_path(&dir).expect("loads"));
    let _ = std::fs::remove_dir_all(&dir);
    let qwen = Arc::new(Tokenizer::default_qwen3().expect("shipped"));
    let mut memo = Memo::new(1 << 20);
    let mut failures = Vec::new();
    let (mut rendered, mut refused) = (0, 0);
    for case in &cases {
        let tok = match case.tokenizer.as_str() {
            "qwen3" => qwen.clone(),
            "llama-3.2" => llama.clone(),
            other => panic!("unknown tokenizer {other}"),
        };
        let mock = MockTokenizer::hf_dated(tok.clone(), date).expect("template compiles");
        let vocab = Vocab::hf_dated(tok, true, date).expect("template compiles");
        match check(case, &mock, &vocab, &mut memo) {
            Ok(true) => rendered += 1,
            Ok(false) => refused += 1,
            Err(e) => failures.push(format!("{}/{}: {e}", case.tokenizer, case.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!((rendered, refused), (45, 5));
}

/// One case: `Ok(true)` rendered and counted as vLLM did, `Ok(false)` refused as vLLM did.
fn check(
    case: &Case,
    mock: &MockTokenizer,
    vocab: &Vocab,
    memo: &mut Memo,
) -> Result<bool, String> {
    let parsed = crate::mock::openai::parse_request(Shape::Chat, case.body.get().as_bytes(), "m");
    if let Some(want) = &case.error {
        assert_eq!(case.error_status, Some(400));
        let err = match parsed {
            Err(e) => e,
            Ok(req) => mock
                .prompt_tokens(&req.prompt)
                .err()
                .ok_or("vLLM refused it, the mock did not")?,
        };
        if err.status != StatusCode::BAD_REQUEST || &err.message != want {
            return Err(format!(
                "refused with {} {:?}, vLLM: 400 {want:?}",
                err.status, err.message
            ));
        }
        return Ok(false);
    }
    let req = parsed.map_err(|e| format!("the parse refused it: {}", e.message))?;
    let (messages, options) = req.prompt.chat().ok_or("not a chat")?;
    let MockTokenizer::Hf {
        template: Some(t), ..
    } = mock
    else {
        return Err("no template".into());
    };
    let text = render_chat(t, messages, options).map_err(|e| e.0)?;
    let want_text = case.prompt_text.as_deref().unwrap_or_default();
    if text != want_text {
        return Err(format!(
            "text differs:\n--- kvbust\n{text}\n--- vLLM\n{want_text}"
        ));
    }
    let want = case.prompt_token_ids.as_deref().unwrap_or_default();
    assert_eq!(case.num_prompt_tokens, Some(want.len()));
    let ids = mock.prompt_tokens(&req.prompt).map_err(|e| e.message)?;
    if ids != want {
        return Err(format!(
            "the mock's {} ids differ from vLLM's {}",
            ids.len(),
            want.len()
        ));
    }
    let got =
        tokens::encode(vocab, memo, &req.prompt, &IsoHint::None).map_err(|e| e.to_string())?;
    if got.ids != want {
        return Err(format!(
            "the model's {} ids differ from vLLM's {}",
            got.ids.len(),
            want.len()
        ));
    }
    Ok(true)
}
