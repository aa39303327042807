//! The pipeline every dialect that speaks chat shares
//! (`/v1/chat/completions`, `/v1/messages`, `/v1/responses`).

use crate::chat::fields::Fields;
use crate::chat::messages::{ChatPrompt, chat_tokens};
use crate::chat::reasoning::Reasoning;
use crate::config::RequestDefaults;
use crate::http::error::ApiError;
use crate::http::generate::Plan;
use crate::http::params::{self, Generation};
use crate::http::state::Ready;

/// A chat body on its way to the engine, parsed the same way by every
/// dialect that speaks chat (`/v1/chat/completions`, `/v1/messages`,
/// `/v1/responses`): the generation fields, then the templated prompt,
/// then how the reply's reasoning is split off. A dialect's own fields
/// adjust `generation` between the steps.
pub struct ChatParse<'a> {
    ready: &'a Ready,
    defaults: &'a RequestDefaults,
    fields: Fields<'a>,
    pub generation: Generation,
}

impl<'a> ChatParse<'a> {
    /// The whole pipeline, for a dialect with nothing of its own between
    /// the steps.
    pub fn plan(
        ready: &'a Ready,
        defaults: &'a RequestDefaults,
        fields: Fields<'a>,
    ) -> Result<(Plan, Reasoning), ApiError> {
        let chat = ChatParse::new(ready, defaults, fields)?;
        let prompt = chat.prompt()?;
        chat.finish(prompt)
    }

    /// The generation fields.
    pub fn new(ready: &'a Ready, defaults: &'a RequestDefaults, fields: Fields<'a>) -> Result<Self, ApiError> {
        let generation = params::generation(fields, &ready.limits(defaults))?;
        Ok(ChatParse { ready, defaults, fields, generation })
    }

    /// The prompt, which must fit the context.
    pub fn prompt(&self) -> Result<ChatPrompt, ApiError> {
        Ok(chat_tokens(&self.ready.template, self.ready.reader(), self.fields, self.defaults.reasoning)?)
    }

    /// The work for the engine and the reply's reasoning split.
    pub fn finish(self, prompt: ChatPrompt) -> Result<(Plan, Reasoning), ApiError> {
        let stream = self.generation.stream;
        let reasoning = Reasoning::new(self.fields, self.defaults.reasoning_format, stream, prompt.opens_thinking)?;
        let reasoning = match prompt.harmony {
            true => reasoning.harmony(prompt.tools.is_some()),
            false => reasoning,
        };
        Ok((Plan { generation: self.generation, prompts: vec![prompt.prompt] }, reasoning))
    }
}
