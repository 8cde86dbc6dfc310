//! Where fields are written in a recipe's text, and which field a line holds.
//!
//! Recipes are block-style YAML. The text is walked by indentation: each
//! `key:` (and each `- ` item of a sequence) gets its dotted path, e.g.
//! `smoke.cases[1].env`, so that an error can name the line of a field
//! ([`locate`]) and a line can be named by its field ([`field_at`]). Flow
//! collections on one line (`pins: {torch: 2.13.0}`, `ids: [1, 2]`) are
//! followed to the position in question.

/// One step of a path: a mapping key or a sequence index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A mapping key.
    Key(String),
    /// A 0-based sequence index.
    Index(usize),
}

/// Renders a path as `a.b[2].c`.
pub fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Parses `a.b[2].c` into segments (the inverse of [`render`] for plain keys).
fn parse_path(field: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Seg::Key(key.to_string()));
        }
        while let Some((n, r)) = rest.split_once(']') {
            if let Ok(i) = n.parse() {
                out.push(Seg::Index(i));
            }
            rest = r.strip_prefix('[').unwrap_or(r);
        }
    }
    out
}

/// A key or sequence item as written on one line.
#[derive(Debug, Clone)]
struct Mark {
    /// 1-based line.
    line: usize,
    /// 0-based character column of the key (or of the item's `-`).
    col: usize,
    /// Its full path.
    path: Vec<Seg>,
    /// For keys: the 0-based character column where the value starts
    /// (after `key:` and spaces); `None` for items.
    value_col: Option<usize>,
}

/// An open mapping key or sequence item while walking down the text.
struct Frame {
    indent: usize,
    path: Vec<Seg>,
    item: bool,
    next_item: usize,
}

/// `key: value` at the start of `rest`: the key and the character offset
/// of the value (after the colon and any spaces).
fn split_key(rest: &str) -> Option<(String, usize)> {
    let chars: Vec<char> = rest.chars().collect();
    let (key, colon) = match chars.first()? {
        q @ ('"' | '\'') => {
            let close = chars.iter().skip(1).position(|c| c == q)? + 1;
            if chars.get(close + 1) != Some(&':') {
                return None;
            }
            (chars[1..close].iter().collect::<String>(), close + 1)
        }
        '{' | '[' | '#' | '&' | '*' | '!' | '|' | '>' | '%' | '@' | '`' => return None,
        _ => {
            let colon = (0..chars.len())
                .find(|&i| chars[i] == ':' && chars.get(i + 1).is_none_or(|c| c.is_whitespace()))?;
            let key: String = chars[..colon].iter().collect();
            if key.contains(" #") || key.trim().is_empty() {
                return None;
            }
            (key.trim_end().to_string(), colon)
        }
    };
    let mut v = colon + 1;
    while chars.get(v).is_some_and(|c| *c == ' ' || *c == '\t') {
        v += 1;
    }
    Some((key, v))
}

/// Every key and sequence item of `text`, in order.
fn marks(text: &str) -> Vec<Mark> {
    let mut out = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    // Lines deeper than this indentation belong to a block scalar (`|`, `>`).
    let mut block_scalar: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let indent = line.chars().take_while(|c| *c == ' ').count();
        let rest: String = line.chars().skip(indent).collect();
        if let Some(b) = block_scalar {
            if rest.trim().is_empty() || indent > b {
                continue;
            }
            block_scalar = None;
        }
        if rest.trim().is_empty() || rest.starts_with('#') || rest.starts_with("---") {
            continue;
        }
        let mut col = indent;
        let mut rest = rest.as_str();
        let is_item = |r: &str| r == "-" || r.starts_with("- ");
        // Close what this line ends: deeper keys, and (for an item) the
        // previous item at the same column.
        while let Some(top) = stack.last() {
            let closes = top.indent > col || (top.indent == col && (!is_item(rest) || top.item));
            if !closes {
                break;
            }
            stack.pop();
        }
        let mut base: Vec<Seg> = stack.last().map(|f| f.path.clone()).unwrap_or_default();
        while is_item(rest) {
            let index = match stack.last_mut() {
                Some(parent) if !parent.item || parent.indent < col => {
                    parent.next_item += 1;
                    parent.next_item - 1
                }
                _ => 0,
            };
            let mut path = base.clone();
            path.push(Seg::Index(index));
            out.push(Mark {
                line: i + 1,
                col,
                path: path.clone(),
                value_col: None,
            });
            stack.push(Frame {
                indent: col,
                path: path.clone(),
                item: true,
                next_item: 0,
            });
            base = path;
            let skip = rest.len() - rest[1..].trim_start_matches(' ').len();
            col += rest[..skip].chars().count();
            rest = &rest[skip..];
        }
        let Some((key, value_off)) = split_key(rest) else {
            continue;
        };
        let mut path = base;
        path.push(Seg::Key(key));
        out.push(Mark {
            line: i + 1,
            col,
            path: path.clone(),
            value_col: Some(col + value_off),
        });
        let value: String = rest.chars().skip(value_off).collect();
        if value.starts_with('|') || value.starts_with('>') {
            block_scalar = Some(indent);
        }
        stack.push(Frame {
            indent: col,
            path,
            item: false,
            next_item: 0,
        });
    }
    out
}

/// The 1-based line where the field `field` (e.g. `source.commit`,
/// `smoke.cases[1].env.HOME`) is written in `text`. When the field itself is
/// not on a line of its own (absent, or inside a one-line `{...}`), the line of
/// the nearest enclosing field that is; `None` when not even the first key is.
pub fn locate(text: &str, field: &str) -> Option<usize> {
    let want = parse_path(field);
    let marks = marks(text);
    (1..=want.len())
        .rev()
        .find_map(|n| marks.iter().find(|m| m.path == want[..n]).map(|m| m.line))
}

/// What is written at a position of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldAt {
    /// The path of the field there (empty: the document itself).
    pub path: Vec<Seg>,
    /// Whether the position is the start of the field's key (not its value).
    pub at_key: bool,
    /// The value written there, as text (up to a `,`, `}`, `]` or comment).
    pub value: String,
}

/// The field written at 1-based `line` and `column` of `text`: the inverse
/// of [`locate`]. Inside a one-line flow collection, the key or index at
/// that column. `None` when the line holds no field.
pub fn field_at(text: &str, line: usize, column: usize) -> Option<FieldAt> {
    let marks = marks(text);
    let col = column.saturating_sub(1);
    let on_line: Vec<&Mark> = marks.iter().filter(|m| m.line == line).collect();
    let mark = on_line
        .iter()
        .rev()
        .find(|m| m.col <= col)
        .or(on_line.first())
        .copied()
        // A line with no key of its own (a continuation): the field before it.
        .or_else(|| marks.iter().rev().find(|m| m.line < line))?;
    let chars: Vec<char> = text.lines().nth(line - 1).unwrap_or("").chars().collect();
    let mut path = mark.path.clone();
    if mark.line == line && col <= mark.col {
        return Some(FieldAt {
            path,
            at_key: true,
            value: value_text(&chars, mark.value_col.unwrap_or(chars.len())),
        });
    }
    let value_col = match mark.value_col {
        Some(v) if mark.line == line => v,
        _ => {
            return Some(FieldAt {
                path,
                at_key: false,
                value: value_text(&chars, col),
            });
        }
    };
    let start = value_col.min(col);
    let (inner, at_key) = flow_path(&chars[start..], col - start);
    path.extend(inner);
    Some(FieldAt {
        path,
        at_key,
        value: value_text(&chars, col.max(value_col)),
    })
}

/// The scalar written from `col`: up to a flow delimiter or a comment;
/// a quoted scalar whole, quotes included.
fn value_text(chars: &[char], col: usize) -> String {
    let rest = chars.get(col..).unwrap_or(&[]);
    if let Some(q @ ('"' | '\'')) = rest.first() {
        let end = rest
            .iter()
            .skip(1)
            .position(|c| c == q)
            .map_or(rest.len(), |p| p + 2);
        return rest[..end].iter().collect();
    }
    let mut out = String::new();
    for (i, c) in rest.iter().enumerate() {
        if matches!(c, ',' | '}' | ']') || (*c == '#' && i > 0 && rest[i - 1] == ' ') {
            break;
        }
        out.push(*c);
    }
    out.trim().to_string()
}

/// Within a flow collection written in `chars` (starting at its value), the
/// keys and indexes that enclose position `upto`, and whether `upto` is the
/// start of a key.
fn flow_path(chars: &[char], upto: usize) -> (Vec<Seg>, bool) {
    enum F {
        Map { key: Option<String>, cur: String },
        Seq { index: usize },
    }
    let mut stack: Vec<F> = Vec::new();
    let mut i = 0;
    while i < upto.min(chars.len()) {
        let c = chars[i];
        match (c, stack.last_mut()) {
            ('"' | '\'', top) => {
                let close = chars[i + 1..]
                    .iter()
                    .position(|x| *x == c)
                    .map_or(chars.len(), |p| i + 1 + p);
                if let Some(F::Map { key: None, cur }) = top {
                    cur.extend(&chars[i + 1..close.min(chars.len())]);
                }
                i = close;
            }
            ('{', _) => stack.push(F::Map {
                key: None,
                cur: String::new(),
            }),
            ('[', _) => stack.push(F::Seq { index: 0 }),
            ('}' | ']', _) => {
                stack.pop();
            }
            (',', Some(F::Map { key, cur })) => {
                *key = None;
                cur.clear();
            }
            (',', Some(F::Seq { index })) => *index += 1,
            (
                ':',
                Some(F::Map {
                    key: key @ None,
                    cur,
                }),
            ) if chars
                .get(i + 1)
                .is_none_or(|n| n.is_whitespace() || *n == ',') =>
            {
                *key = Some(cur.trim().to_string());
            }
            (_, Some(F::Map { key: None, cur })) => cur.push(c),
            _ => {}
        }
        i += 1;
    }
    let mut path = Vec::new();
    let mut at_key = false;
    let n = stack.len();
    for (depth, f) in stack.into_iter().enumerate() {
        match f {
            F::Map { key: Some(k), .. } => path.push(Seg::Key(k)),
            F::Map { key: None, cur } if depth + 1 == n && cur.trim().is_empty() => {
                // At the start of a key: read it ahead.
                let ahead: String = chars[upto.min(chars.len())..]
                    .iter()
                    .take_while(|c| !matches!(c, ':' | ',' | '}'))
                    .collect();
                let k = ahead.trim().trim_matches(['"', '\'']).to_string();
                if !k.is_empty() {
                    path.push(Seg::Key(k));
                    at_key = true;
                }
            }
            F::Map { .. } => {}
            F::Seq { index } => path.push(Seg::Index(index)),
        }
    }
    (path, at_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "name: t\nsource:\n  repo: file:///x\n  commit: abc\npins: {torch: 2.1, \"numpy\": 2}\nsmoke:\n  env:\n    A: \"0\"\n  probe: {module: a, colour: red}\n  cases:\n    - name: a\n      model: /m\n      prompt: |\n        name: not a key\n      prompt_token_ids: [1, x]\n    - name: b\n      env: {HOME: /h}\n  runs: 3\nindexes:\n- https://a\n- https://b\n";

    fn at(line: usize, col: usize) -> (String, bool, String) {
        let f = field_at(TEXT, line, col).unwrap();
        (render(&f.path), f.at_key, f.value)
    }

    #[test]
    fn locates_nested_fields_items_and_flow_keys() {
        assert_eq!(locate(TEXT, "source.commit"), Some(4));
        assert_eq!(locate(TEXT, "smoke.env.A"), Some(8));
        assert_eq!(locate(TEXT, "smoke.cases[1].name"), Some(16));
        assert_eq!(locate(TEXT, "smoke.cases[1].env.HOME"), Some(17));
        assert_eq!(locate(TEXT, "smoke.runs"), Some(18));
        assert_eq!(locate(TEXT, "pins.torch"), Some(5));
        assert_eq!(locate(TEXT, "indexes[1]"), Some(21));
        assert_eq!(locate(TEXT, "expect.torch_version"), None);
        assert_eq!(locate(TEXT, "smoke.cases[0].name"), Some(11));
    }

    #[test]
    fn names_the_field_at_a_position() {
        assert_eq!(at(4, 11), ("source.commit".into(), false, "abc".into()));
        assert_eq!(at(4, 3), ("source.commit".into(), true, "abc".into()));
        assert_eq!(at(5, 20), ("pins.numpy".into(), true, "\"numpy\"".into()));
        assert_eq!(at(5, 15), ("pins.torch".into(), false, "2.1".into()));
        assert_eq!(at(9, 22).0, "smoke.probe.colour");
        assert!(at(9, 22).1);
        assert_eq!(
            at(15, 29),
            (
                "smoke.cases[0].prompt_token_ids[1]".into(),
                false,
                "x".into()
            )
        );
        assert_eq!(at(14, 9).0, "smoke.cases[0].prompt");
        assert_eq!(at(18, 9), ("smoke.runs".into(), false, "3".into()));
        assert_eq!(at(21, 3), ("indexes[1]".into(), false, "https://b".into()));
        assert_eq!(at(17, 13).0, "smoke.cases[1].env.HOME");
    }

    #[test]
    fn paths_round_trip() {
        let p = parse_path("smoke.cases[2].env.A_B");
        assert_eq!(render(&p), "smoke.cases[2].env.A_B");
        assert_eq!(p[2], Seg::Index(2));
    }
}
