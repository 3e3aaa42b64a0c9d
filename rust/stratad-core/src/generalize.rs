//! Goal generalization and entity detection for crystals.
//!
//! A crystal stores a goal *template*: `Deploy src/app.py to
//! https://prod.example.com` becomes `Deploy {file_path} to {url}` so that it
//! matches later goals with other values. The five rules of docs/native.md
//! run in order, each on the text between placeholders only, so a rule never
//! rewrites what an earlier rule (or the user) already generalized. The
//! rules are small hand-written scanners rather than regexes because
//! several need context (the character before a match, trailing punctuation,
//! segments of a path) that would otherwise need look-around, which the
//! Rust `regex` crate does not have.

/// A stretch of the goal: literal text, or a placeholder (with the entity
/// type it stands for when a rule inserted it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Placeholder(String, Option<&'static str>),
}

/// Known file extensions and the entity type of each.
const EXTENSIONS: &[(&str, &str)] = &[
    ("py", "python_file"),
    ("pyi", "python_file"),
    ("ipynb", "python_file"),
    ("js", "javascript_file"),
    ("jsx", "javascript_file"),
    ("mjs", "javascript_file"),
    ("cjs", "javascript_file"),
    ("ts", "typescript_file"),
    ("tsx", "typescript_file"),
    ("json", "config_file"),
    ("yaml", "config_file"),
    ("yml", "config_file"),
    ("toml", "config_file"),
    ("ini", "config_file"),
    ("cfg", "config_file"),
    ("conf", "config_file"),
    ("env", "config_file"),
    ("md", "document_file"),
    ("rst", "document_file"),
    ("txt", "document_file"),
    ("pdf", "document_file"),
    ("csv", "data_file"),
    ("tsv", "data_file"),
    ("parquet", "data_file"),
    ("xlsx", "data_file"),
    ("db", "data_file"),
    ("sqlite", "data_file"),
    ("sh", "shell_script"),
    ("bash", "shell_script"),
    ("sql", "sql_file"),
    ("go", "source_file"),
    ("rs", "source_file"),
    ("java", "source_file"),
    ("kt", "source_file"),
    ("c", "source_file"),
    ("h", "source_file"),
    ("cc", "source_file"),
    ("cpp", "source_file"),
    ("hpp", "source_file"),
    ("cs", "source_file"),
    ("rb", "source_file"),
    ("php", "source_file"),
    ("swift", "source_file"),
    ("html", "file"),
    ("css", "file"),
    ("xml", "file"),
    ("log", "file"),
    ("lock", "file"),
    ("png", "file"),
    ("jpg", "file"),
    ("jpeg", "file"),
    ("gif", "file"),
    ("svg", "file"),
    ("zip", "file"),
    ("tar", "file"),
    ("gz", "file"),
];

/// Entity type of a known extension (ASCII case-insensitive).
fn extension_type(extension: &str) -> Option<&'static str> {
    EXTENSIONS
        .iter()
        .find(|(ext, _)| ext.eq_ignore_ascii_case(extension))
        .map(|&(_, kind)| kind)
}

/// Characters removed from the end of URLs, endpoint candidates and paths.
fn is_trailing(c: u8) -> bool {
    matches!(
        c,
        b'.' | b',' | b';' | b':' | b'!' | b'?' | b')' | b']' | b'}' | b'>' | b'\'' | b'"' | b'`'
    )
}

/// Characters removed from the start of file path tokens.
fn is_leading(c: u8) -> bool {
    matches!(c, b'"' | b'\'' | b'(' | b'[' | b'{' | b'<' | b'`')
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// End (byte index) of the run of non-whitespace characters starting at
/// `from` (a char boundary). Whitespace is Unicode `White_Space`.
fn run_end(text: &str, from: usize) -> usize {
    text[from..]
        .char_indices()
        .find(|&(_, c)| c.is_whitespace())
        .map_or(text.len(), |(i, _)| from + i)
}

/// `end` moved back over trailing punctuation, not before `start`.
fn strip_trailing(bytes: &[u8], start: usize, mut end: usize) -> usize {
    while end > start && is_trailing(bytes[end - 1]) {
        end -= 1;
    }
    end
}

/// Splits `text` into literal text and `{` + `[A-Za-z0-9_]+` + `}`
/// placeholders (leftmost first, non-overlapping).
fn split_placeholders(text: &str) -> Vec<Piece> {
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    let mut last = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'{' {
            let mut end = i + 1;
            while end < bytes.len() && is_word(bytes[end]) {
                end += 1;
            }
            if end > i + 1 && bytes.get(end) == Some(&b'}') {
                if last < i {
                    pieces.push(Piece::Text(text[last..i].to_owned()));
                }
                pieces.push(Piece::Placeholder(text[i..=end].to_owned(), None));
                last = end + 1;
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    if last < text.len() {
        pieces.push(Piece::Text(text[last..].to_owned()));
    }
    pieces
}

/// Collects a rule's output for one stretch of text: literal text between
/// the replaced spans, and a placeholder for each span.
struct Output<'a> {
    text: &'a str,
    pieces: Vec<Piece>,
    copied_to: usize,
}

impl<'a> Output<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            pieces: Vec::new(),
            copied_to: 0,
        }
    }

    /// Replaces `text[start..end]` (after everything replaced so far).
    fn replace(&mut self, start: usize, end: usize, placeholder: &str, entity: &'static str) {
        if self.copied_to < start {
            self.pieces
                .push(Piece::Text(self.text[self.copied_to..start].to_owned()));
        }
        self.pieces
            .push(Piece::Placeholder(placeholder.to_owned(), Some(entity)));
        self.copied_to = end;
    }

    fn finish(mut self) -> Vec<Piece> {
        if self.copied_to < self.text.len() {
            self.pieces
                .push(Piece::Text(self.text[self.copied_to..].to_owned()));
        }
        self.pieces
    }
}

/// Rule 1: `"` + one or more non-`"` characters + `"` -> `"{value}"`.
fn quoted_values(text: &str) -> Vec<Piece> {
    let bytes = text.as_bytes();
    let mut out = Output::new(text);
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        let Some(close) = bytes[i + 1..].iter().position(|&b| b == b'"') else {
            break;
        };
        let close = i + 1 + close;
        if close == i + 1 {
            // `""`: the second quote may open a value.
            i += 1;
            continue;
        }
        out.replace(i + 1, close, "{value}", "quoted_value");
        i = close + 1;
    }
    out.finish()
}

fn is_scheme_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'.' | b'-')
}

/// Rule 2: `scheme://...` up to whitespace, minus trailing punctuation.
fn urls(text: &str) -> Vec<Piece> {
    let bytes = text.as_bytes();
    let mut out = Output::new(text);
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let mut scheme_end = i + 1;
        while scheme_end < bytes.len() && is_scheme_char(bytes[scheme_end]) {
            scheme_end += 1;
        }
        if !bytes[scheme_end..].starts_with(b"://") {
            // Every start inside this run of scheme characters ends at the
            // same place, so none of them can match either.
            i = scheme_end;
            continue;
        }
        let rest = scheme_end + 3;
        let run = run_end(text, rest);
        let end = strip_trailing(bytes, rest, run);
        if end > rest {
            out.replace(i, end, "{url}", "url");
            i = end;
        } else {
            i = run;
        }
    }
    out.finish()
}

/// Whether a candidate (from its `/`, without trailing punctuation) is an
/// API endpoint.
fn is_endpoint(candidate: &str) -> bool {
    let path = candidate
        .find(['?', '#'])
        .map_or(candidate, |cut| &candidate[..cut]);
    let Some(path) = path.strip_prefix('/') else {
        return false;
    };
    let mut segments = path.split('/');
    let first = segments.next().unwrap_or("");
    let last = segments.next_back().unwrap_or(first);
    let first_ok = matches!(first, "api" | "rest" | "graphql" | "rpc")
        || first
            .strip_prefix('v')
            .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
    first_ok && !last.contains('.')
}

/// Rule 3: rooted API paths (`/api/...`, `/v2/...`) -> `{api_endpoint}`.
fn api_endpoints(text: &str) -> Vec<Piece> {
    let bytes = text.as_bytes();
    let mut out = Output::new(text);
    let mut i = 0;
    while i < bytes.len() {
        let starts = bytes[i] == b'/'
            && (i == 0 || !(is_word(bytes[i - 1]) || bytes[i - 1] == b'/' || bytes[i - 1] == b'.'));
        if starts {
            let end = strip_trailing(bytes, i, run_end(text, i));
            if is_endpoint(&text[i..end]) {
                out.replace(i, end, "{api_endpoint}", "api_endpoint");
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out.finish()
}

/// The extension of a path: the text after the last `.` of its last `/`-
/// or `\`-separated component, if that component has a `.`.
fn path_extension(path: &str) -> Option<&str> {
    let component = path.rsplit(['/', '\\']).next().unwrap_or(path);
    component.rfind('.').map(|dot| &component[dot + 1..])
}

/// Whether a stripped token is a file path (rule 4).
fn is_file_path(core: &str) -> bool {
    let has_separator = core.contains(['/', '\\']);
    if has_separator {
        return core.chars().any(|c| c != '/' && c != '\\');
    }
    if !core.bytes().all(|b| is_word(b) || b == b'.' || b == b'-') {
        return false;
    }
    match core.rfind('.') {
        Some(dot) if dot > 0 => extension_type(&core[dot + 1..]).is_some(),
        _ => false,
    }
}

/// Rule 4: file paths (any token with a `/` or `\`, or a bare `name.ext`
/// with a known extension) -> `{file_path}`.
fn file_paths(text: &str) -> Vec<Piece> {
    let bytes = text.as_bytes();
    let mut out = Output::new(text);
    let mut chars = text.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let end = run_end(text, start);
        while chars.peek().is_some_and(|&(i, _)| i < end) {
            chars.next();
        }
        let mut core_start = start;
        while core_start < end && is_leading(bytes[core_start]) {
            core_start += 1;
        }
        let core_end = strip_trailing(bytes, core_start, end);
        let core = &text[core_start..core_end];
        if !core.is_empty() && is_file_path(core) {
            let kind = path_extension(core)
                .and_then(extension_type)
                .unwrap_or("file");
            out.replace(core_start, core_end, "{file_path}", kind);
        }
    }
    out.finish()
}

/// Rule 5: numbers not touching an ASCII letter or `_` -> `{N}`.
fn numbers(text: &str) -> Vec<Piece> {
    let bytes = text.as_bytes();
    let mut out = Output::new(text);
    let digits_end = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let mut end = digits_end(i);
        while end + 1 < bytes.len()
            && matches!(bytes[end], b'.' | b',')
            && bytes[end + 1].is_ascii_digit()
        {
            end = digits_end(end + 1);
        }
        let touches = |c: Option<&u8>| c.is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_');
        let before = if i > 0 { bytes.get(i - 1) } else { None };
        if !touches(before) && !touches(bytes.get(end)) {
            out.replace(i, end, "{N}", "number");
        }
        i = end;
    }
    out.finish()
}

/// Runs the five rules in order and returns the resulting pieces.
fn generalize_pieces(goal: &str) -> Vec<Piece> {
    let rules: [fn(&str) -> Vec<Piece>; 5] =
        [quoted_values, urls, api_endpoints, file_paths, numbers];
    let mut pieces = split_placeholders(goal);
    for rule in rules {
        pieces = pieces
            .into_iter()
            .flat_map(|piece| match piece {
                Piece::Text(text) => rule(&text),
                placeholder => vec![placeholder],
            })
            .collect();
    }
    pieces
}

/// Replaces specific values in `goal` with placeholders (`{value}`, `{url}`,
/// `{api_endpoint}`, `{file_path}`, `{N}`); see docs/native.md for the
/// exact rules.
pub fn generalize_goal(goal: &str) -> String {
    let mut out = String::with_capacity(goal.len());
    for piece in generalize_pieces(goal) {
        match piece {
            Piece::Text(text) | Piece::Placeholder(text, _) => out.push_str(&text),
        }
    }
    out
}

/// Entity types found in `text` (the types of the placeholders
/// [`generalize_goal`] inserts, in output order, without repeats).
pub fn detect_entity_types(text: &str) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    for piece in generalize_pieces(text) {
        if let Piece::Placeholder(_, Some(kind)) = piece {
            if !types.iter().any(|t| t == kind) {
                types.push(kind.to_owned());
            }
        }
    }
    types
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cases: &[(&str, &str)]) {
        for &(input, expected) in cases {
            assert_eq!(generalize_goal(input), expected, "input: {input:?}");
        }
    }

    #[test]
    fn the_contract_table() {
        check(&[
            ("Deploy src/app.py", "Deploy {file_path}"),
            ("Process 150 records", "Process {N} records"),
            ("Call /api/users/list", "Call {api_endpoint}"),
            ("Visit https://example.com", "Visit {url}"),
            ("Set \"production\"", "Set \"{value}\""),
        ]);
    }

    #[test]
    fn seed_example() {
        check(&[
            (
                "Deploy app.py to https://prod.example.com",
                "Deploy {file_path} to {url}",
            ),
            (
                "Deploy server.py to staging",
                "Deploy {file_path} to staging",
            ),
        ]);
        assert_eq!(
            detect_entity_types("Deploy app.py to https://prod.example.com"),
            ["python_file", "url"]
        );
    }

    #[test]
    fn quoted_values() {
        check(&[
            ("say \"a\" and \"b c\"", "say \"{value}\" and \"{value}\""),
            ("empty \"\" stays", "empty \"\" stays"),
            ("\"\"abc\"", "\"\"{value}\""),
            ("unclosed \"abc", "unclosed \"abc"),
            ("\"https://x.com\"", "\"{value}\""),
            ("\"{value}\"", "\"{value}\""),
            ("\"a {x} b\"", "\"a {x} b\""),
            ("\"multi\nline\"", "\"{value}\""),
        ]);
    }

    #[test]
    fn urls() {
        check(&[
            (
                "Fetch https://example.com:8443/a/b?q=1&r=2#frag now",
                "Fetch {url} now",
            ),
            ("(see http://x.io/path).", "(see {url})."),
            ("go to https://x.io/a, then", "go to {url}, then"),
            ("ftp://files.example.org/pub/file.tar.gz", "{url}"),
            ("git+ssh://git@host:22/repo.git!", "{url}!"),
            ("x.y-https://a", "{url}"),
            ("1https://a", "{N}{url}"),
            ("http://. next", "{file_path}. next"),
            ("http:// next", "{file_path} next"),
            ("no scheme ://x", "no scheme {file_path}"),
            ("a http://x.io\u{a0}b c", "a {url}\u{a0}b c"),
            (
                "Visit https://{host}/x",
                "Visit {file_path}{host}{file_path}",
            ),
            ("http://localhost:8080", "{url}"),
            ("s3://bucket/key", "{url}"),
        ]);
    }

    #[test]
    fn api_endpoints() {
        check(&[
            ("Call /api/users/list", "Call {api_endpoint}"),
            ("GET /v2/items?limit=10 now", "GET {api_endpoint} now"),
            ("POST /graphql", "POST {api_endpoint}"),
            ("use /rest/orders/", "use {api_endpoint}"),
            ("(/rpc/call)", "({api_endpoint})"),
            ("the /api endpoint", "the {api_endpoint} endpoint"),
            ("/api/users.json", "{file_path}"),
            ("/api/v1.2", "{file_path}"),
            ("/apis/x", "{file_path}"),
            ("/v/x", "{file_path}"),
            ("/V1/x", "{file_path}"),
            ("/API/x", "{file_path}"),
            ("example.com/api/x", "{file_path}"),
            ("x=/api/users", "x={api_endpoint}"),
            ("/x?next=/api/users", "{file_path}{api_endpoint}"),
            ("//api/x", "{file_path}"),
            ("/api/x.y?z=1", "{file_path}"),
            ("/api/x?file=a.py", "{api_endpoint}"),
        ]);
    }

    #[test]
    fn file_paths() {
        check(&[
            ("Deploy src/app.py", "Deploy {file_path}"),
            ("run ./run.sh now", "run {file_path} now"),
            ("edit ~/notes.md.", "edit {file_path}."),
            ("cat /etc/hosts", "cat {file_path}"),
            ("open C:\\dir\\file.txt", "open {file_path}"),
            ("open C:\\Program Files\\x", "open {file_path} {file_path}"),
            ("in D:/data/x.csv,", "in {file_path},"),
            (
                "edit config.yaml and app.PY",
                "edit {file_path} and {file_path}",
            ),
            ("read (src/main.rs)", "read ({file_path})"),
            ("'src/a.py'", "'{file_path}'"),
            ("`src/a.py`", "`{file_path}`"),
            ("<src/a.py>", "<{file_path}>"),
            ("node.js is known", "{file_path} is known"),
            (
                "example.com and e.g. and v1.2",
                "example.com and e.g. and v1.2",
            ),
            (".env and .gitignore", ".env and .gitignore"),
            ("a.b.py", "{file_path}"),
            (
                "a/b/ and / and // and \\",
                "{file_path} and / and // and \\",
            ),
            ("and/or", "{file_path}"),
            ("file name.py", "file {file_path}"),
            ("x=app.py", "x=app.py"),
            ("my-file.test.ts", "{file_path}"),
            ("((", "(("),
        ]);
    }

    #[test]
    fn numbers() {
        check(&[
            ("Process 150 records", "Process {N} records"),
            ("ratio 3.5 of 1,000 items", "ratio {N} of {N} items"),
            (
                "utf8 v2 60s py311 x86_64 1st",
                "utf8 v2 60s py311 x86_64 1st",
            ),
            ("2024-01-15", "{N}-{N}-{N}"),
            ("-5 and +7%", "-{N} and +{N}%"),
            ("$100.", "${N}."),
            ("1.2.3", "{N}"),
            ("1..2", "{N}..{N}"),
            ("a1.5", "a1.5"),
            ("_1 1_", "_1 1_"),
            ("café5", "café{N}"),
            ("(42)", "({N})"),
            ("{N}5", "{N}{N}"),
            ("{x 5}", "{x {N}}"),
            ("{5}", "{5}"),
            ("1e5", "1e5"),
        ]);
    }

    #[test]
    fn several_placeholders_in_one_goal() {
        let goal = "Deploy src/app.py to https://prod.example.com:443/x?y=1 \
                    via /api/v2/deploy with \"blue\" 3 times, see C:\\logs\\run.log";
        assert_eq!(
            generalize_goal(goal),
            "Deploy {file_path} to {url} via {api_endpoint} with \"{value}\" {N} times, \
             see {file_path}"
        );
        assert_eq!(
            detect_entity_types(goal),
            [
                "python_file",
                "url",
                "api_endpoint",
                "quoted_value",
                "number",
                "file"
            ]
        );
    }

    #[test]
    fn existing_placeholders_are_kept() {
        check(&[
            ("Deploy {file_path} to {url}", "Deploy {file_path} to {url}"),
            ("{a}/x.py", "{a}{file_path}"),
            ("{url}:8080", "{url}:{N}"),
            ("{{x}}", "{{x}}"),
            ("{N} and 5", "{N} and {N}"),
        ]);
        // Generalizing is idempotent on its own output.
        for goal in [
            "Deploy src/app.py to https://prod.example.com",
            "Process 150 records from /api/v1/items and \"x\"",
        ] {
            let once = generalize_goal(goal);
            assert_eq!(generalize_goal(&once), once);
        }
        assert!(detect_entity_types("Deploy {file_path} to {url}").is_empty());
    }

    #[test]
    fn entity_types() {
        assert_eq!(detect_entity_types("nothing here"), Vec::<String>::new());
        assert_eq!(
            detect_entity_types("edit a.py b.py c.ts d.json e.md f.csv g.sh h.sql i.go j.html"),
            [
                "python_file",
                "typescript_file",
                "config_file",
                "document_file",
                "data_file",
                "shell_script",
                "sql_file",
                "source_file",
                "file"
            ]
        );
        assert_eq!(
            detect_entity_types("load src/.env then ./Makefile then C:\\X\\Y.IPYNB"),
            ["config_file", "file", "python_file"]
        );
        assert_eq!(
            detect_entity_types("7 \"x\" 8 /api/x https://a"),
            ["number", "quoted_value", "api_endpoint", "url"]
        );
        assert_eq!(detect_entity_types("a.mjs b.cjs"), ["javascript_file"]);
        assert_eq!(detect_entity_types("x.pyi y.ipynb"), ["python_file"]);
    }

    #[test]
    fn unicode_and_whitespace() {
        check(&[
            ("", ""),
            ("   ", "   "),
            (
                "déployer src/é.py\u{3000}150",
                "déployer {file_path}\u{3000}{N}",
            ),
            ("tab\tsrc/a.py\n42", "tab\t{file_path}\n{N}"),
            ("emoji 🚀/x", "emoji {file_path}"),
        ]);
    }

    #[test]
    fn placeholder_splitting() {
        assert_eq!(
            split_placeholders("a{b}c{}{d_1}{e"),
            vec![
                Piece::Text("a".into()),
                Piece::Placeholder("{b}".into(), None),
                Piece::Text("c{}".into()),
                Piece::Placeholder("{d_1}".into(), None),
                Piece::Text("{e".into()),
            ]
        );
    }
}
