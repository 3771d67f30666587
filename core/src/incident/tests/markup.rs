//! The incident page's markup as a browser's tokenizer reads it, and what the renderer may
//! write: shared by core's tests of the renderer and the e2e tests of Chromium's DOM (which
//! include this file by its path).

/// The page as a browser's tokenizer reads it (WHATWG tokenization): names lowercased,
/// attribute values unquoted and their character references decoded, whatever the quoting.
#[derive(Debug, Default)]
pub struct Tokens {
    /// Each start tag's name and attributes (name, value).
    pub start_tags: Vec<(String, Vec<(String, String)>)>,
    /// The text, character references decoded.
    pub text: String,
    /// Parse errors, each with where it is: the renderer writes none, so each would come from
    /// input.
    pub errors: Vec<String>,
}

pub fn tokens(page: &str) -> Tokens {
    let mut emitter = html5gum::DefaultEmitter::<usize>::new_with_span();
    // The style and title elements hold raw text, as a browser's tree builder tells its tokenizer.
    emitter.naively_switch_states(true);
    let lossy = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut tokens = Tokens::default();
    for Ok(token) in html5gum::Tokenizer::new_with_emitter(page, emitter) {
        match token {
            html5gum::Token::StartTag(tag) => tokens.start_tags.push((
                lossy(&tag.name),
                tag.attributes.iter().map(|(name, value)| (lossy(name), lossy(value))).collect(),
            )),
            html5gum::Token::String(text) => tokens.text.push_str(&lossy(&text)),
            html5gum::Token::Error(error) => {
                let around = &page.as_bytes()[error.span.start.saturating_sub(40)..page.len().min(error.span.end + 40)];
                let around = String::from_utf8_lossy(around);
                tokens.errors.push(format!("{} at byte {}, in {around:?}", error.value, error.span.start));
            }
            html5gum::Token::EndTag(_) | html5gum::Token::Comment(_) | html5gum::Token::Doctype(_) => {}
        }
    }
    tokens
}

/// Elements and attributes the renderer writes; anything else came from the input.
pub const TAGS: &[&str] = &[
    "html", "head", "meta", "title", "style", "body", "header", "p", "span", "h1", "h2", "h3", "main", "section",
    "div", "dl", "dt", "dd", "code", "br", "time", "ul", "ol", "li", "label", "input", "article", "figure", "svg",
    "path", "g", "circle", "text", "details", "summary", "footer",
];
pub const ATTRIBUTES: &[&str] = &[
    "lang",
    "charset",
    "name",
    "content",
    "http-equiv",
    "class",
    "id",
    "type",
    "role",
    "aria-label",
    "viewbox",
    "width",
    "height",
    "d",
    "cx",
    "cy",
    "r",
    "x",
    "y",
];
