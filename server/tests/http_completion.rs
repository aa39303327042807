//! Completions over real HTTP: streaming and not give the same tokens,
//! text and probabilities for a seed (native, `/v1/completions`, chat);
//! prompt caching changes counts, never tokens; probability shapes.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::{Server, Stream};

const PROMPT: &str = "The three primary colors are";

fn ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, answer) = server.post(path, body);
    assert_eq!(status, StatusCode::OK, "{path} {body}: {answer}\n{}", server.log());
    answer
}

fn streamed(server: &Server, path: &str, body: &Value) -> Stream {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let stream = server.stream(path, &body);
    assert_eq!(stream.status, StatusCode::OK, "{path}: {}\n{}", stream.error, server.log());
    assert!(stream.content_type.starts_with("text/event-stream"), "{}", stream.content_type);
    stream
}

/// Token ids of llama-server probability entries.
fn ids(entries: &[Value]) -> Vec<u64> {
    entries.iter().map(|entry| entry["id"].as_u64().expect("id")).collect()
}

#[test]
fn native_stream_and_non_stream_agree() {
    let server = Server::start(&[]);
    let body = json!({
        "prompt": PROMPT, "n_predict": 12, "seed": 42, "temperature": 0.9,
        "n_probs": 3, "return_tokens": true,
    });
    let whole = ok(&server, "/completion", &body);
    let stream = streamed(&server, "/completion", &body);
    assert!(!stream.done, "native streams end without [DONE]");
    let (last, chunks) = stream.events.split_last().expect("a final chunk");
    assert_eq!(last["stop"], true, "{last}");
    assert!(
        chunks.iter().all(|chunk| chunk["stop"] == false && chunk["tokens"].as_array().is_some_and(|t| t.len() == 1))
    );
    let content: String = stream.events.iter().map(|event| event["content"].as_str().expect("content")).collect();
    let tokens: Vec<Value> = chunks.iter().map(|chunk| chunk["tokens"][0].clone()).collect();
    let probs: Vec<Value> = chunks.iter().map(|chunk| chunk["completion_probabilities"][0].clone()).collect();

    assert_eq!(content, whole["content"], "{whole}");
    assert_eq!(Value::Array(tokens.clone()), whole["tokens"]);
    assert_eq!(tokens.len() as u64, whole["tokens_predicted"].as_u64().expect("tokens_predicted"));
    let whole_probs = whole["completion_probabilities"].as_array().expect("completion_probabilities");
    assert_eq!(ids(&probs), ids(whole_probs));
    for (streamed, whole) in probs.iter().zip(whole_probs) {
        assert_eq!(streamed["top_logprobs"], whole["top_logprobs"]);
        assert_eq!(streamed["logprob"], whole["logprob"]);
    }
    assert_eq!(last["stop_type"], whole["stop_type"]);
    assert_eq!(last["tokens_predicted"], whole["tokens_predicted"]);
    assert!(last.get("completion_probabilities").is_none(), "{last}");
}

#[test]
fn openai_stream_and_non_stream_agree() {
    let server = Server::start(&[]);

    let body = json!({ "prompt": PROMPT, "max_tokens": 10, "seed": 7, "logprobs": 2 });
    let whole = ok(&server, "/v1/completions", &body);
    assert_eq!(whole["object"], "text_completion");
    assert!(whole["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")));
    let choice = &whole["choices"][0];
    let stream = streamed(&server, "/v1/completions", &body);
    assert!(stream.done, "OpenAI streams end with [DONE]");
    let text: String = stream.events.iter().map(|event| event["choices"][0]["text"].as_str().expect("text")).collect();
    assert_eq!(text, choice["text"]);
    let entries: Vec<Value> = stream
        .events
        .iter()
        .filter_map(|event| event["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(ids(&entries), ids(choice["logprobs"]["content"].as_array().expect("logprobs")));
    let last = stream.events.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], choice["finish_reason"]);
    // The stream ran second on the same prompt: only its cached count may differ.
    assert_eq!(last["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    assert_eq!(last["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]);
    assert!(last["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    assert!(stream.events.iter().all(|event| event["id"] == stream.events[0]["id"]));

    let chat = json!({
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 10, "seed": 3, "logprobs": true, "top_logprobs": 2,
        "stream_options": {"include_usage": true},
    });
    let whole = ok(&server, "/v1/chat/completions", &chat);
    assert_eq!(whole["object"], "chat.completion");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    let stream = streamed(&server, "/v1/chat/completions", &chat);
    assert!(stream.done);
    let events = &stream.events;
    assert_eq!(events[0]["choices"][0]["delta"], json!({"role": "assistant", "content": null}), "role delta first");
    assert!(events.iter().all(|event| event["object"] == "chat.completion.chunk" && event["id"] == events[0]["id"]));
    let content: String = events.iter().filter_map(|event| event["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, message["content"]);
    let usage = events.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]), "the usage chunk comes last: {usage}");
    assert_eq!(usage["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    let finish = &events[events.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    let entries: Vec<Value> = events
        .iter()
        .filter_map(|event| event["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    let whole_entries = whole["choices"][0]["logprobs"]["content"].as_array().expect("chat logprobs");
    assert_eq!(ids(&entries), ids(whole_entries));
    assert!(whole_entries.iter().all(|entry| entry["top_logprobs"].as_array().is_some_and(|top| top.len() == 2)));
    // An end of generation is listed last, as llama-server lists it; the
    // tokens before it spell the content.
    let ended = whole["choices"][0]["finish_reason"] == "stop";
    let spelled = &whole_entries[..whole_entries.len() - usize::from(ended)];
    let joined: String = spelled.iter().map(|entry| entry["token"].as_str().expect("token")).collect();
    assert_eq!(joined, message["content"], "the tokens of the logprobs spell the content");
    if ended {
        assert_eq!(whole_entries.last().map(|entry| entry["token"].clone()), Some(json!("<|im_end|>")));
    }

    // timings_per_token puts `timings` on every token chunk, native and OpenAI.
    for path in ["/completion", "/v1/completions", "/v1/chat/completions"] {
        let body = json!({
            "prompt": PROMPT, "messages": [{"role": "user", "content": "Hi"}],
            "n_predict": 4, "timings_per_token": true, "ignore_eos": true,
            // Greedy, so no token ends inside a character: a held-back
            // partial character would come out as a chunk of its own at the end.
            "temperature": 0,
        });
        let stream = streamed(&server, path, &body);
        let token_chunks: Vec<&Value> = stream
            .events
            .iter()
            .filter(|event| match event["choices"].as_array() {
                None => event["stop"] == json!(false),
                Some(choices) => choices
                    .first()
                    .is_some_and(|choice| choice["finish_reason"].is_null() && choice["delta"].get("role").is_none()),
            })
            .collect();
        assert_eq!(token_chunks.len(), 4, "{path}: {:?}", stream.events);
        for (n, chunk) in token_chunks.iter().enumerate() {
            assert_eq!(chunk["timings"]["predicted_n"], n + 1, "{path}: {chunk}");
            assert!(chunk["timings"]["prompt_n"].as_u64().is_some_and(|n| n > 0), "{path}: {chunk}");
        }
    }
}

#[test]
fn cache_and_no_cache_agree_with_cached_counts() {
    let server = Server::start(&["-np", "2"]);
    let prompt = "Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, \
                  lemon, mango, nectarine, orange, papaya, quince, raspberry. The next fruit is";
    let body = |cache: bool| json!({ "prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": cache });
    let first = ok(&server, "/completion", &body(true));
    let n_prompt = first["tokens_evaluated"].as_u64().expect("tokens_evaluated");
    assert!(n_prompt > 40, "the prompt should span several KV blocks: {n_prompt}");
    assert_eq!(first["tokens_cached"], 0, "{first}");
    assert_eq!(first["timings"]["cache_n"], 0);
    assert_eq!(first["timings"]["prompt_n"], n_prompt);

    let cached = ok(&server, "/completion", &body(true));
    let cache_n = cached["timings"]["cache_n"].as_u64().expect("cache_n");
    assert_eq!(cache_n, n_prompt - 1, "reused down to the token, all but the last, as llama-server does");
    assert_eq!(cached["tokens_cached"], cache_n);
    assert_eq!(cache_n + cached["timings"]["prompt_n"].as_u64().expect("prompt_n"), n_prompt);
    assert_eq!(cached["content"], first["content"], "a cached prefix must not change the tokens");

    // A short repeated prompt, inside one KV block.
    let short = json!({ "prompt": "Hello there", "n_predict": 4, "temperature": 0 });
    let cold = ok(&server, "/completion", &short);
    let warm = ok(&server, "/completion", &short);
    assert_eq!(warm["timings"]["cache_n"].as_u64(), cold["tokens_evaluated"].as_u64().map(|n| n - 1), "{warm}");
    assert_eq!(warm["content"], cold["content"]);

    let uncached = ok(&server, "/completion", &body(false));
    assert_eq!(uncached["timings"]["cache_n"], 0);
    assert_eq!(uncached["tokens_cached"], 0);
    assert_eq!(uncached["content"], first["content"]);

    let chat = json!({
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "Which fruit comes next?"}],
        "max_tokens": 8, "temperature": 0,
    });
    let cold = ok(&server, "/v1/chat/completions", &chat);
    let warm = ok(&server, "/v1/chat/completions", &chat);
    let cached_tokens = warm["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    assert!(cached_tokens > 0, "{warm}");
    assert_eq!(warm["timings"]["cache_n"], cached_tokens);
    assert_eq!(warm["usage"]["prompt_tokens"], cold["usage"]["prompt_tokens"]);
    assert_eq!(warm["choices"][0]["message"]["content"], cold["choices"][0]["message"]["content"]);
}

#[test]
fn probabilities_have_llama_server_shapes() {
    let server = Server::start(&[]);
    let check_pre = |entry: &Value, n: usize| {
        assert!(entry["id"].is_u64() && entry["token"].is_string() && entry["bytes"].is_array(), "{entry}");
        assert!(entry["logprob"].as_f64().is_some_and(|logprob| logprob <= 0.0), "{entry}");
        let top = entry["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), n, "{entry}");
        let logprobs: Vec<f64> = top.iter().map(|alt| alt["logprob"].as_f64().expect("logprob")).collect();
        assert!(logprobs.windows(2).all(|pair| pair[0] >= pair[1]), "most likely first: {entry}");
        assert!(top.iter().all(|alt| alt["id"].is_u64() && alt["token"].is_string() && alt["bytes"].is_array()));
    };
    let check_post = |entry: &Value, n: usize| {
        assert!(entry["prob"].as_f64().is_some_and(|prob| prob > 0.0 && prob <= 1.0), "{entry}");
        assert!(entry.get("logprob").is_none(), "{entry}");
        let top = entry["top_probs"].as_array().expect("top_probs");
        assert!(!top.is_empty() && top.len() <= n, "{entry}");
        let sum: f64 = top.iter().map(|alt| alt["prob"].as_f64().expect("prob")).sum();
        assert!(sum <= 1.0 + 1e-4, "{entry}");
        if top.len() < n {
            assert!((sum - 1.0).abs() < 1e-3, "fewer than n candidates cover all the mass: {entry}");
        }
    };

    let pre = ok(&server, "/completion", &json!({ "prompt": PROMPT, "n_predict": 5, "n_probs": 10, "seed": 1 }));
    let entries = pre["completion_probabilities"].as_array().expect("completion_probabilities");
    assert_eq!(entries.len(), 5);
    entries.iter().for_each(|entry| check_pre(entry, 10));

    let body = json!({ "prompt": PROMPT, "n_predict": 5, "n_probs": 4, "seed": 1, "post_sampling_probs": true });
    let post = ok(&server, "/completion", &body);
    post["completion_probabilities"].as_array().expect("probs").iter().for_each(|entry| check_post(entry, 4));
    let stream = streamed(&server, "/completion", &body);
    let chunks = &stream.events[..stream.events.len() - 1];
    assert_eq!(chunks.len(), 5);
    for chunk in chunks {
        let probs = chunk["completion_probabilities"].as_array().expect("one entry per chunk");
        assert_eq!(probs.len(), 1);
        check_post(&probs[0], 4);
    }

    let stream = streamed(&server, "/completion", &json!({ "prompt": PROMPT, "n_predict": 3, "n_probs": 2 }));
    for chunk in &stream.events[..stream.events.len() - 1] {
        check_pre(&chunk["completion_probabilities"][0], 2);
    }

    let completions = ok(&server, "/v1/completions", &json!({ "prompt": PROMPT, "max_tokens": 3, "logprobs": 2 }));
    let content = completions["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content");
    assert_eq!(content.len(), 3);
    content.iter().for_each(|entry| check_pre(entry, 2));
    let plain = ok(&server, "/v1/completions", &json!({ "prompt": PROMPT, "max_tokens": 2 }));
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);

    let chat = json!({ "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 3 });
    let answer = ok(&server, "/v1/chat/completions", &chat);
    answer["choices"][0]["logprobs"]["content"].as_array().expect("chat logprobs").iter().for_each(|e| check_pre(e, 3));
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let stream = server.stream("/v1/chat/completions", &chat_stream);
    let entries: Vec<&Value> = stream
        .events
        .iter()
        .filter_map(|event| event["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .collect();
    assert!(!entries.is_empty());
    entries.iter().for_each(|entry| check_pre(entry, 3));
    let (status, refused) = server
        .post("/v1/chat/completions", &json!({ "messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2 }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
}

#[test]
fn prompt_shapes_and_several_completions() {
    let server = Server::start(&["-np", "2"]);
    let greedy = |prompt: Value| json!({ "prompt": prompt, "n_predict": 4, "temperature": 0, "return_tokens": true });
    let text = ok(&server, "/completion", &greedy(json!(PROMPT)));
    let (_, tokens) = server.post("/tokenize", &json!({ "content": PROMPT, "add_special": true }));
    let ids = tokens["tokens"].clone();
    let from_ids = ok(&server, "/completion", &greedy(ids.clone()));
    assert_eq!(from_ids["tokens"], text["tokens"], "a token-array prompt is the same prompt");
    assert_eq!(from_ids["tokens_evaluated"], text["tokens_evaluated"]);

    // A top-level array of strings is several prompts: an array answer.
    let several = ok(&server, "/completion", &greedy(json!([PROMPT, "Hello"])));
    let results = several.as_array().expect("one result per prompt");
    assert_eq!(results.len(), 2);
    assert_eq!((results[0]["index"].clone(), results[1]["index"].clone()), (json!(0), json!(1)));
    assert_eq!(results[0]["tokens"], text["tokens"]);

    let projected = ok(
        &server,
        "/completion",
        &json!({ "prompt": PROMPT, "n_predict": 2, "response_fields": ["content", "generation_settings/n_predict"] }),
    );
    assert_eq!(projected.as_object().map(|object| object.len()), Some(2), "{projected}");
    assert_eq!(projected["generation_settings/n_predict"], 2);

    let chat = json!({ "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "n": 2, "seed": 5 });
    let answer = ok(&server, "/v1/chat/completions", &chat);
    let choices = answer["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2, "{answer}");
    assert_eq!((choices[0]["index"].clone(), choices[1]["index"].clone()), (json!(0), json!(1)));
    assert_eq!(answer["usage"]["completion_tokens"], 6);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let stream = server.stream("/v1/chat/completions", &streamed);
    assert!(stream.done);
    let finishes = stream.events.iter().filter(|event| event["choices"][0]["finish_reason"].is_string()).count();
    assert_eq!(finishes, 2, "one finish_reason per choice");
}

#[test]
fn a_trailing_assistant_message_is_continued() {
    let server = Server::start(&["-np", "1"]);
    let prefill = json!([
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "My favourite colour is"},
    ]);
    let prompt = ok(&server, "/apply-template", &json!({ "messages": prefill }))["prompt"].clone();
    let prompt = prompt.as_str().expect("prompt");
    assert!(prompt.ends_with("<|im_start|>assistant\nMy favourite colour is"), "{prompt}");
    // Its text parts join with a blank line, as llama-server joins them.
    let parts = json!([
        {"role": "user", "content": [{"type": "text", "text": "Name"}, {"type": "text", "text": "a colour."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "My"}, {"type": "text", "text": "colour"}]},
    ]);
    let joined = ok(&server, "/apply-template", &json!({ "messages": parts }))["prompt"].clone();
    let joined = joined.as_str().expect("prompt");
    assert!(joined.contains("Name\na colour.") && joined.ends_with("assistant\nMy\n\ncolour"), "{joined}");
    // The continuation is what a plain completion of that prompt gives.
    let chat = ok(&server, "/v1/chat/completions", &json!({ "messages": prefill, "max_tokens": 6, "temperature": 0 }));
    let plain = ok(&server, "/completion", &json!({ "prompt": prompt, "n_predict": 6, "temperature": 0 }));
    assert_eq!(chat["choices"][0]["message"]["content"], plain["content"], "{chat}");

    let twice = json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "assistant", "content": "there"},
    ]);
    let both = json!({ "messages": prefill, "add_generation_prompt": true, "continue_final_message": true });
    let (status, error) = server.post("/v1/chat/completions", &both);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    for path in ["/apply-template", "/v1/chat/completions"] {
        let (status, error) = server.post(path, &json!({ "messages": twice }));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["error"]["message"], "Cannot have 2 or more assistant messages at the end of the list.");
    }
}

#[test]
fn the_end_of_generation_token_is_listed_like_any_other() {
    let server = Server::start(&["-np", "1"]);
    let (_, end) = server.post("/tokenize", &json!({ "content": "<|im_end|>", "parse_special": true }));
    let end = end["tokens"][0].clone();
    // The end of the turn made certain: the reply is that one token.
    let body = json!({
        "prompt": PROMPT, "n_predict": 16, "temperature": 0, "n_probs": 2, "return_tokens": true,
        "logit_bias": [[end, 100.0]],
    });
    let whole = ok(&server, "/completion", &body);
    assert_eq!(whole["stop_type"], "eos", "the reply should end itself: {whole}");
    let tokens = whole["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.last(), Some(&end), "{whole}");
    assert_eq!(Some(tokens.len() as u64), whole["tokens_predicted"].as_u64());
    let probs = whole["completion_probabilities"].as_array().expect("probabilities");
    assert_eq!(probs.len(), tokens.len());
    let stream = streamed(&server, "/completion", &body);
    let streamed_tokens: Vec<Value> =
        stream.events.iter().filter_map(|event| event["tokens"].as_array()).flatten().cloned().collect();
    assert_eq!(&streamed_tokens, tokens, "the stream lists the same tokens, the end included");
}

#[test]
fn streams_report_prompt_progress_when_asked() {
    // A prompt of several 16-token steps.
    let server = Server::start(&["-np", "1", "-b", "16"]);
    let prompt = "one two three four five six seven eight nine ten ".repeat(4);
    let body = json!({ "prompt": prompt, "n_predict": 2, "return_progress": true, "timings_per_token": true });
    let stream = streamed(&server, "/completion", &body);
    let progress: Vec<&Value> = stream.events.iter().filter_map(|event| event.get("prompt_progress")).collect();
    assert!(progress.len() > 2, "one report at the start, then one per step: {:?}", stream.events);
    let total = progress[0]["total"].as_u64().expect("total");
    assert_eq!(progress[0]["processed"], progress[0]["cache"], "the first report comes before any work");
    assert_eq!(stream.events[0]["timings"]["prompt_n"], 0, "{}", stream.events[0]);
    for pair in progress.windows(2) {
        assert_eq!(pair[1]["total"], total);
        assert!(pair[1]["processed"].as_u64() > pair[0]["processed"].as_u64(), "{pair:?}");
    }
    assert_eq!(progress.last().map(|last| last["processed"].as_u64()), Some(Some(total)));

    // The same request again borrows the cached prompt; chat reports
    // progress on assistant-role deltas.
    let chat = json!({
        "messages": [{ "role": "user", "content": prompt }], "max_tokens": 2,
        "return_progress": true,
    });
    streamed(&server, "/v1/chat/completions", &chat);
    let stream = streamed(&server, "/v1/chat/completions", &chat);
    let first = &stream.events[0];
    assert_eq!(first["choices"][0]["delta"], json!({ "role": "assistant", "content": null }), "{first}");
    assert!(first["prompt_progress"]["cache"].as_u64() > Some(0), "{first}");

    // Without a stream, or without asking, there is none.
    let plain = streamed(&server, "/completion", &json!({ "prompt": prompt, "n_predict": 2 }));
    assert!(plain.events.iter().all(|event| event.get("prompt_progress").is_none()));
}

#[test]
fn verbose_adds_the_native_response_to_openai_ones() {
    let server = Server::start(&[]);
    let messages =
        json!([{ "role": "system", "content": "Book" }, { "role": "user", "content": "What is the best book" }]);
    for verbose in [true, false] {
        let answer =
            ok(&server, "/v1/chat/completions", &json!({ "messages": messages, "max_tokens": 2, "verbose": verbose }));
        match answer.get("__verbose") {
            Some(native) => {
                assert!(verbose);
                assert!(native["prompt"].as_str().is_some_and(|prompt| prompt.contains("Book")), "{native}");
                assert_eq!(native["tokens_predicted"], answer["usage"]["completion_tokens"]);
            }
            None => assert!(!verbose, "{answer}"),
        }
    }
    // --verbose makes it the default, streamed too (on the final chunks' first).
    let server = Server::start(&["--verbose"]);
    let answer = ok(&server, "/v1/completions", &json!({ "prompt": PROMPT, "max_tokens": 2 }));
    assert!(answer.get("__verbose").is_some(), "{answer}");
    let stream = streamed(&server, "/v1/chat/completions", &json!({ "messages": messages, "max_tokens": 2 }));
    assert_eq!(stream.events.iter().filter(|event| event.get("__verbose").is_some()).count(), 1);
}
