//! llama.cpp's built-in chat template names (`--chat-template llama3`),
//! as Jinja: each renders what llama.cpp's own formatter of that name writes
//! for system, user and assistant messages (trimming where it trims,
//! merging system prompts where the format has no system turn).

/// The Jinja source of a built-in template name.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(known, _)| *known == name).map(|(_, source)| *source)
}

/// Every built-in template as (name, Jinja source), `chatml` first.
pub fn builtins() -> &'static [(&'static str, &'static str)] {
    BUILTIN
}

const BUILTIN: &[(&str, &str)] = &[
    ("chatml", CHATML),
    (
        "llama2",
        "[INST] {% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\
         {% elif m.role == 'user' %}{{ m.content }} [/INST]{% else %}{{ m.content }}</s>\
         {% if not loop.last %}[INST] {% endif %}{% endif %}{% endfor %}",
    ),
    (
        "llama2-sys",
        "[INST] {% for m in messages %}{% if m.role == 'system' %}<<SYS>>\n{{ m.content }}\n<</SYS>>\n\n\
         {% elif m.role == 'user' %}{{ m.content }} [/INST]{% else %}{{ m.content }}</s>\
         {% if not loop.last %}[INST] {% endif %}{% endif %}{% endfor %}",
    ),
    (
        "mistral-v7",
        "{% for m in messages %}{% if m.role == 'system' %}[SYSTEM_PROMPT] {{ m.content }}[/SYSTEM_PROMPT]\
         {% elif m.role == 'user' %}[INST] {{ m.content }}[/INST]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}",
    ),
    (
        "phi3",
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    ),
    (
        "phi4",
        "{% for m in messages %}<|im_start|>{{ m.role }}<|im_sep|>{{ m.content }}<|im_end|>{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}",
    ),
    (
        "falcon3",
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    ),
    (
        "zephyr",
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    ),
    (
        "gemma",
        "{% set ns = namespace(system='') %}{% for m in messages %}{% if m.role == 'system' %}\
         {% set ns.system = ns.system + (m.content | trim) %}{% else %}\
         {% set role = 'model' if m.role == 'assistant' else m.role %}<start_of_turn>{{ role }}\n\
         {% if ns.system and role != 'model' %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}\
         {{ m.content | trim }}<end_of_turn>\n{% endif %}{% endfor %}\
         {% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    ),
    (
        "openchat",
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}<|end_of_turn|>\
         {% else %}GPT4 Correct {{ m.role | capitalize }}: {{ m.content }}<|end_of_turn|>{% endif %}{% endfor %}\
         {% if add_generation_prompt %}GPT4 Correct Assistant:{% endif %}",
    ),
    (
        "vicuna",
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n\
         {% elif m.role == 'user' %}USER: {{ m.content }}\n{% elif m.role == 'assistant' %}ASSISTANT: {{ m.content }}</s>\n\
         {% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}",
    ),
    (
        "deepseek",
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\
         {% elif m.role == 'user' %}### Instruction:\n{{ m.content }}\n\
         {% elif m.role == 'assistant' %}### Response:\n{{ m.content }}\n<|EOT|>\n{% endif %}{% endfor %}\
         {% if add_generation_prompt %}### Response:\n{% endif %}",
    ),
    (
        "deepseek2",
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n\
         {% elif m.role == 'user' %}User: {{ m.content }}\n\n\
         {% elif m.role == 'assistant' %}Assistant: {{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}\
         {% if add_generation_prompt %}Assistant:{% endif %}",
    ),
    (
        "deepseek3",
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n\
         {% elif m.role == 'user' %}<｜User｜>{{ m.content }}\
         {% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}\
         {% if add_generation_prompt %}<｜Assistant｜>{% endif %}",
    ),
    (
        "command-r",
        "{% set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} %}\
         {% for m in messages %}{% if m.role in tokens %}<|START_OF_TURN_TOKEN|>{{ tokens[m.role] }}\
         {{ m.content | trim }}<|END_OF_TURN_TOKEN|>{% endif %}{% endfor %}\
         {% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}",
    ),
    (
        "llama3",
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>\
         {% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    ),
    (
        "chatglm4",
        "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    ),
];

/// ChatML, also for models without a template of their own.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
                          message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}\
                          {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use sluice_model::chat_template::ChatTemplate;

    /// What llama.cpp's formatters write for a conversation whose system
    /// prompt and first user turn have stray spaces (some formats trim).
    #[test]
    fn builtins_write_what_llama_cpp_writes() {
        let messages = json!([
            {"role": "system", "content": "Be brief. "},
            {"role": "user", "content": " Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ]);
        let messages = messages.as_array().cloned().unwrap_or_default();
        let cases = [
            (
                "chatml",
                "<|im_start|>system\nBe brief. <|im_end|>\n<|im_start|>user\n Hi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
            ),
            (
                "llama3",
                "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            ),
            (
                "command-r",
                "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
            ),
            (
                "gemma",
                "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
            ),
            ("llama2-sys", "[INST] <<SYS>>\nBe brief. \n<</SYS>>\n\n Hi [/INST]Hello</s>[INST] Bye [/INST]"),
            ("llama2", "[INST] Be brief. \n Hi [/INST]Hello</s>[INST] Bye [/INST]"),
            ("mistral-v7", "[SYSTEM_PROMPT] Be brief. [/SYSTEM_PROMPT][INST]  Hi[/INST] Hello</s>[INST] Bye[/INST]"),
            ("vicuna", "Be brief. \n\nUSER:  Hi\nASSISTANT: Hello</s>\nUSER: Bye\nASSISTANT:"),
            (
                "deepseek3",
                "Be brief. \n\n<｜User｜> Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>",
            ),
            (
                "phi3",
                "<|system|>\nBe brief. <|end|>\n<|user|>\n Hi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n",
            ),
            (
                "openchat",
                "Be brief. <|end_of_turn|>GPT4 Correct User:  Hi<|end_of_turn|>GPT4 Correct Assistant: Hello<|end_of_turn|>GPT4 Correct User: Bye<|end_of_turn|>GPT4 Correct Assistant:",
            ),
        ];
        for (name, want) in cases {
            let source = builtin(name).unwrap_or_else(|| panic!("{name} is built in"));
            let template = ChatTemplate::new(source, "<s>", "</s>").unwrap_or_else(|error| panic!("{name}: {error}"));
            assert_eq!(template.render(&messages, true).expect("renders"), want, "{name}");
        }
        for (name, source) in BUILTIN {
            ChatTemplate::new(source, "<s>", "</s>")
                .and_then(|template| template.render(&messages, true))
                .unwrap_or_else(|error| panic!("{name}: {error}"));
        }
    }
}
