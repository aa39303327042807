//! Structured-output fields: `grammar` (GBNF, or llguidance's Lark after
//! `%llguidance`), `json_schema` (native endpoints) and `response_format`
//! (OpenAI's), compiled into the request's [`Grammar`]. Errors are 400s
//! naming the field and the construct or position.

use serde_json::{Value, json};

use super::error::Error;
use super::fields::{Fields, wrong};
use sluice_engine::constraint::{Grammar, GrammarSource, Grammars};

/// The grammar compiler, or why this model has none.
pub type Compiler = Result<Grammars, String>;

/// The request's grammar, if it asks for one.
pub fn grammar(fields: Fields<'_>, compiler: &Compiler) -> Result<Option<Grammar>, Error> {
    let Some((field, source)) = source(fields)? else { return Ok(None) };
    compile(field, &source, compiler).map(Some)
}

/// Compile `source`, read from `field`.
pub fn compile(field: &str, source: &GrammarSource, compiler: &Compiler) -> Result<Grammar, Error> {
    let grammars = compiler.as_ref().map_err(|reason| {
        Error::invalid(format!(
            "`{field}` cannot be used: constrained decoding is unavailable for this model ({reason})"
        ))
    })?;
    // A compiler failure that names nothing (a panic llguidance caught) is
    // still the grammar's: compiling is a function of it alone, so the
    // same request fails the same way every time. The client gets the id
    // of the logged detail.
    grammars.compile(source).map_err(|error| Error::invalid(format!("`{field}`: {error}")))
}

/// Which field asks for what, if any does.
fn source(fields: Fields<'_>) -> Result<Option<(&'static str, GrammarSource)>, Error> {
    let grammar = fields.str("grammar")?.filter(|grammar| !grammar.is_empty());
    let schema = match (fields.get("json_schema"), response_format(fields)?) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid("either `json_schema` or `response_format` can be given, not both"));
        }
        (Some(schema @ (Value::Object(_) | Value::Bool(_))), None) => Some(("json_schema", schema.clone())),
        (Some(_), None) => return Err(wrong("json_schema", "a JSON schema (an object)")),
        (None, schema) => schema.map(|schema| ("response_format", schema)),
    };
    Ok(match (grammar, schema) {
        (Some(_), Some((field, _))) => {
            return Err(Error::invalid(format!("either `{field}` or `grammar` can be given, not both")));
        }
        // llama.cpp hands grammars that start so to llguidance as they are.
        (Some(text), None) if text.trim_start().starts_with("%llguidance") => {
            Some(("grammar", GrammarSource::Lark(text.to_owned())))
        }
        (Some(text), None) => Some(("grammar", GrammarSource::Gbnf(text.to_owned()))),
        (None, Some((field, schema))) => Some((field, GrammarSource::JsonSchema(schema))),
        (None, None) => None,
    })
}

/// OpenAI's `response_format`: `text`, `json_object` (any JSON object, or
/// the `schema` given beside it, as llama-server reads it) or `json_schema`
/// (`{json_schema: {name, schema, strict}}`; the schema is always enforced).
fn response_format(fields: Fields<'_>) -> Result<Option<Value>, Error> {
    let Some(format) = fields.get("response_format") else { return Ok(None) };
    let Value::Object(format) = format else { return Err(wrong("response_format", "an object")) };
    let format = Fields(format);
    let schema = |value: Option<&Value>, field: &str| match value {
        None => Ok(None),
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(schema.clone())),
        Some(_) => Err(wrong(field, "a JSON schema (an object)")),
    };
    match format.str("type").map_err(|_| wrong("response_format.type", "a string"))?.unwrap_or("text") {
        "text" => Ok(None),
        "json_object" => Ok(Some(
            schema(format.get("schema"), "response_format.schema")?.unwrap_or_else(|| json!({"type": "object"})),
        )),
        "json_schema" => {
            let empty = serde_json::Map::new();
            let wrapper = match format.get("json_schema") {
                Some(Value::Object(wrapper)) => Fields(wrapper),
                Some(_) => return Err(wrong("response_format.json_schema", "an object")),
                // As llama-server: no wrapper is any JSON value.
                None => Fields(&empty),
            };
            // A schema beside the type (as with json_object) is taken too.
            let given = schema(wrapper.get("schema"), "response_format.json_schema.schema")?
                .or(schema(format.get("schema"), "response_format.schema")?);
            Ok(Some(given.unwrap_or_else(|| json!({}))))
        }
        other => Err(Error::invalid(format!(
            "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\", not {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;

    fn read(body: Value) -> Result<Option<(&'static str, GrammarSource)>, String> {
        let map: Map<String, Value> = body.as_object().cloned().unwrap_or_default();
        source(Fields(&map)).map_err(|error| error.to_string())
    }

    #[test]
    fn fields_map_to_sources() {
        assert_eq!(read(json!({})), Ok(None));
        assert_eq!(read(json!({"grammar": ""})), Ok(None));
        assert_eq!(
            read(json!({"grammar": "root ::= \"a\""})),
            Ok(Some(("grammar", GrammarSource::Gbnf("root ::= \"a\"".into()))))
        );
        assert_eq!(
            read(json!({"grammar": "%llguidance {}\nstart: \"a\""})),
            Ok(Some(("grammar", GrammarSource::Lark("%llguidance {}\nstart: \"a\"".into()))))
        );
        assert_eq!(
            read(json!({"json_schema": {"type": "string"}})),
            Ok(Some(("json_schema", GrammarSource::JsonSchema(json!({"type": "string"})))))
        );
        assert_eq!(
            read(json!({"response_format": {"type": "json_object"}})),
            Ok(Some(("response_format", GrammarSource::JsonSchema(json!({"type": "object"})))))
        );
        let schema = json!({"type": "array"});
        assert_eq!(
            read(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}})
            ),
            Ok(Some(("response_format", GrammarSource::JsonSchema(schema))))
        );
        assert_eq!(read(json!({"response_format": {"type": "text"}})), Ok(None));
    }

    #[test]
    fn conflicts_and_wrong_shapes_name_the_field() {
        let message = read(json!({"grammar": "root ::= \"a\"", "json_schema": {}})).unwrap_err();
        assert!(message.contains("json_schema") && message.contains("grammar"), "{message}");
        let message = read(json!({"json_schema": "{}"})).unwrap_err();
        assert!(message.contains("`json_schema`"), "{message}");
        let message = read(json!({"response_format": {"type": "xml"}})).unwrap_err();
        assert!(message.contains("response_format.type") && message.contains("xml"), "{message}");
        assert_eq!(
            read(json!({"response_format": {"type": "json_schema"}})),
            Ok(Some(("response_format", GrammarSource::JsonSchema(json!({})))))
        );
        let message = read(json!({"json_schema": {}, "response_format": {"type": "json_object"}})).unwrap_err();
        assert!(message.contains("not both"), "{message}");
        let message =
            read(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}})).unwrap_err();
        assert!(message.contains("response_format.json_schema.schema"), "{message}");
    }
}
