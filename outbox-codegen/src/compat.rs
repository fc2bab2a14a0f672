//! Compatibility classification between two versions of a payload schema.
//!
//! Words as in schema registries: a change is **backward** compatible when
//! new readers can read data written with the old schema, **forward**
//! compatible when old readers can read data written with the new schema,
//! **full** when both, **breaking** when neither. Each change found gets its
//! own pair of answers; the whole diff is the weakest of them. The rules,
//! with serde's behaviour in mind (unknown fields are ignored unless the
//! type says `deny_unknown_fields`, which schemars writes as
//! `additionalProperties: false`), are listed in the README of this crate
//! and tested one by one.
//!
//! This file walks two schemas side by side (resolving `$ref` into `$defs`)
//! and reports changes with the logical path of the field concerned
//! (`/properties/lines/items/properties/sku`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The compatibility class of a set of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compatibility {
    /// Backward and forward compatible (or no change at all).
    Full,
    /// New readers read old data; old readers may fail on new data.
    Backward,
    /// Old readers read new data; new readers may fail on old data.
    Forward,
    /// Neither direction is safe.
    Breaking,
}

impl Compatibility {
    fn from_flags(backward: bool, forward: bool) -> Compatibility {
        match (backward, forward) {
            (true, true) => Compatibility::Full,
            (true, false) => Compatibility::Backward,
            (false, true) => Compatibility::Forward,
            (false, false) => Compatibility::Breaking,
        }
    }

    /// Whether new readers can read old data (what an upcaster otherwise provides).
    pub fn is_backward(self) -> bool {
        matches!(self, Compatibility::Full | Compatibility::Backward)
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compatibility::Full => "full",
            Compatibility::Backward => "backward",
            Compatibility::Forward => "forward",
            Compatibility::Breaking => "breaking",
        })
    }
}

/// One change between two schemas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Logical path of the place that changed.
    pub path: String,
    /// What changed, in words, naming the field.
    pub description: String,
    /// New readers can read old data despite this change.
    pub backward: bool,
    /// Old readers can read new data despite this change.
    pub forward: bool,
}

impl Change {
    /// The class of this single change.
    pub fn compatibility(&self) -> Compatibility {
        Compatibility::from_flags(self.backward, self.forward)
    }
}

/// All changes between two schemas and their overall class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Classification {
    /// Every change, in walk order (properties sorted by name).
    pub changes: Vec<Change>,
}

impl Classification {
    /// The weakest class over all changes (`Full` when nothing changed).
    pub fn compatibility(&self) -> Compatibility {
        let backward = self.changes.iter().all(|c| c.backward);
        let forward = self.changes.iter().all(|c| c.forward);
        Compatibility::from_flags(backward, forward)
    }

    /// A short list of the changes for one report line.
    pub fn describe(&self) -> String {
        if self.changes.is_empty() {
            return "no contract change".to_owned();
        }
        self.changes
            .iter()
            .map(|c| format!("{} [{}]", c.description, c.compatibility()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Classifies the change from `old` to `new` (two JSON Schemas).
pub fn classify(old: &Value, new: &Value) -> Classification {
    let mut walker = Walker {
        old_root: old,
        new_root: new,
        visited: HashSet::new(),
        changes: Vec::new(),
    };
    walker.compare(old, new, String::new());
    Classification {
        changes: walker.changes,
    }
}

/// Keywords that document a schema without constraining data.
pub(crate) const ANNOTATIONS: &[&str] = &[
    "$comment",
    "$schema",
    "deprecated",
    "description",
    "examples",
    "readOnly",
    "title",
    "writeOnly",
];

/// The schema with annotation keywords removed at every schema position
/// (property names that happen to be called `description` stay).
pub fn strip_annotations(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if ANNOTATIONS.contains(&key.as_str()) {
                    continue;
                }
                let value = match key.as_str() {
                    "properties" | "$defs" | "definitions" | "patternProperties"
                    | "dependentSchemas" => match value {
                        Value::Object(children) => Value::Object(
                            children
                                .iter()
                                .map(|(name, child)| (name.clone(), strip_annotations(child)))
                                .collect(),
                        ),
                        other => other.clone(),
                    },
                    "items"
                    | "additionalProperties"
                    | "not"
                    | "if"
                    | "then"
                    | "else"
                    | "contains"
                    | "propertyNames"
                    | "unevaluatedProperties"
                    | "unevaluatedItems"
                    | "additionalItems" => strip_annotations(value),
                    "anyOf" | "oneOf" | "allOf" | "prefixItems" => match value {
                        Value::Array(items) => {
                            Value::Array(items.iter().map(strip_annotations).collect())
                        }
                        other => other.clone(),
                    },
                    _ => value.clone(),
                };
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The first place where two JSON values differ, as a JSON pointer with the
/// two values found there (`None` when one side lacks the key).
pub fn first_difference(
    old: &Value,
    new: &Value,
) -> Option<(String, Option<Value>, Option<Value>)> {
    fn walk(
        old: &Value,
        new: &Value,
        pointer: &mut String,
    ) -> Option<(String, Option<Value>, Option<Value>)> {
        match (old, new) {
            (Value::Object(a), Value::Object(b)) => {
                let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for key in keys {
                    let length = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    let found = match (a.get(key), b.get(key)) {
                        (Some(x), Some(y)) => walk(x, y, pointer),
                        (x, y) => Some((pointer.clone(), x.cloned(), y.cloned())),
                    };
                    if found.is_some() {
                        return found;
                    }
                    pointer.truncate(length);
                }
                None
            }
            (Value::Array(a), Value::Array(b)) => {
                for index in 0..a.len().max(b.len()) {
                    let length = pointer.len();
                    pointer.push_str(&format!("/{index}"));
                    let found = match (a.get(index), b.get(index)) {
                        (Some(x), Some(y)) => walk(x, y, pointer),
                        (x, y) => Some((pointer.clone(), x.cloned(), y.cloned())),
                    };
                    if found.is_some() {
                        return found;
                    }
                    pointer.truncate(length);
                }
                None
            }
            (a, b) if a == b => None,
            (a, b) => Some((pointer.clone(), Some(a.clone()), Some(b.clone()))),
        }
    }
    let mut pointer = String::new();
    walk(old, new, &mut pointer)
        .map(|(p, a, b)| (if p.is_empty() { "/".to_owned() } else { p }, a, b))
}

struct Walker<'a> {
    old_root: &'a Value,
    new_root: &'a Value,
    visited: HashSet<(String, String)>,
    changes: Vec<Change>,
}

/// What a schema node says, with the patterns schemars writes flattened:
/// `anyOf [X, {"type":"null"}]` is X plus null, `oneOf` of consts is an enum.
#[derive(Default)]
struct Shape<'a> {
    /// Allowed JSON types; empty means any.
    types: BTreeSet<String>,
    /// Allowed values (`enum`/`const`), if restricted.
    values: Option<Vec<Value>>,
    properties: BTreeMap<&'a str, &'a Value>,
    required: BTreeSet<&'a str>,
    is_object: bool,
    additional: Additional<'a>,
    items: Option<&'a Value>,
    format: Option<&'a str>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    default_present: bool,
    alternatives: Vec<&'a Value>,
    never: bool,
}

#[derive(Default, Clone, Copy)]
enum Additional<'a> {
    #[default]
    Allowed,
    Denied,
    Schema(&'a Value),
}

impl Additional<'_> {
    fn allows_unknown(self) -> bool {
        !matches!(self, Additional::Denied)
    }
}

impl<'a> Walker<'a> {
    fn push(&mut self, path: &str, description: String, backward: bool, forward: bool) {
        self.changes.push(Change {
            path: if path.is_empty() {
                "/".to_owned()
            } else {
                path.to_owned()
            },
            description,
            backward,
            forward,
        });
    }

    fn resolve(root: &'a Value, mut node: &'a Value) -> (&'a Value, Option<String>) {
        let mut reference = None;
        for _ in 0..32 {
            let Some(target) = node.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let Some(found) = target
                .strip_prefix('#')
                .and_then(|pointer| root.pointer(pointer))
            else {
                break;
            };
            reference = Some(target.to_owned());
            node = found;
        }
        (node, reference)
    }

    fn shape(root: &'a Value, node: &'a Value) -> Shape<'a> {
        let (node, _) = Self::resolve(root, node);
        let mut shape = Shape::default();
        let Value::Object(map) = node else {
            shape.never = node == &Value::Bool(false);
            return shape;
        };
        match map.get("type") {
            Some(Value::String(t)) => {
                shape.types.insert(t.clone());
            }
            Some(Value::Array(ts)) => {
                shape
                    .types
                    .extend(ts.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            _ => {}
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            shape.values = Some(values.clone());
        }
        if let Some(value) = map.get("const") {
            shape.values = Some(vec![value.clone()]);
        }
        if let Some(Value::Object(properties)) = map.get("properties") {
            shape.properties = properties.iter().map(|(k, v)| (k.as_str(), v)).collect();
            shape.is_object = true;
        }
        if let Some(Value::Array(required)) = map.get("required") {
            shape.required = required.iter().filter_map(Value::as_str).collect();
        }
        if shape.types.contains("object") {
            shape.is_object = true;
        }
        shape.additional = match map.get("additionalProperties") {
            Some(Value::Bool(false)) => Additional::Denied,
            Some(Value::Bool(true)) | None => Additional::Allowed,
            Some(schema) => Additional::Schema(schema),
        };
        shape.items = map.get("items");
        shape.format = map.get("format").and_then(Value::as_str);
        shape.minimum = map.get("minimum").and_then(Value::as_f64);
        shape.maximum = map.get("maximum").and_then(Value::as_f64);
        shape.default_present = map.contains_key("default");
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alternatives)) = map.get(key) {
                Self::absorb_alternatives(root, alternatives, &mut shape);
            }
        }
        shape
    }

    /// Folds the schemars patterns for Option and unit enums into the shape;
    /// keeps anything else as alternatives.
    fn absorb_alternatives(root: &'a Value, alternatives: &'a [Value], shape: &mut Shape<'a>) {
        let resolved: Vec<&'a Value> = alternatives
            .iter()
            .map(|a| Self::resolve(root, a).0)
            .collect();
        let is_null = |v: &Value| {
            v.get("type") == Some(&Value::String("null".into()))
                && v.as_object().is_some_and(|m| m.len() == 1)
        };
        let consts: Option<Vec<Value>> = resolved
            .iter()
            .map(|alternative| alternative.get("const").cloned())
            .collect();
        if let Some(values) = consts {
            for alternative in &resolved {
                if let Some(t) = alternative.get("type").and_then(Value::as_str) {
                    shape.types.insert(t.to_owned());
                }
            }
            shape.values = Some(values);
            return;
        }
        let non_null: Vec<&'a Value> = alternatives
            .iter()
            .zip(&resolved)
            .filter(|(_, resolved)| !is_null(resolved))
            .map(|(original, _)| original)
            .collect();
        let has_null = non_null.len() < alternatives.len();
        if has_null && non_null.len() == 1 {
            // `Option<T>` of a derived type: T's shape plus null. An untyped T
            // (any value) already admits null.
            let mut inner = Self::shape(root, non_null[0]);
            inner.default_present |= shape.default_present;
            if let Some(values) = &mut inner.values {
                values.push(Value::Null);
            }
            if !inner.types.is_empty() {
                inner.types.insert("null".to_owned());
            }
            *shape = inner;
            return;
        }
        shape.alternatives = alternatives.iter().collect();
    }

    fn compare(&mut self, old: &'a Value, new: &'a Value, path: String) {
        let (old_resolved, old_ref) = Self::resolve(self.old_root, old);
        let (new_resolved, new_ref) = Self::resolve(self.new_root, new);
        if let (Some(a), Some(b)) = (&old_ref, &new_ref)
            && !self.visited.insert((a.clone(), b.clone()))
        {
            return;
        }
        if strip_annotations(old_resolved) == strip_annotations(new_resolved)
            && !contains_ref(old_resolved)
        {
            return;
        }
        let old_shape = Self::shape(self.old_root, old_resolved);
        let new_shape = Self::shape(self.new_root, new_resolved);
        let field = field_name(&path);

        if old_shape.never != new_shape.never {
            let opened = old_shape.never;
            self.push(
                &path,
                format!(
                    "{field} {} every value",
                    if opened { "now accepts" } else { "now rejects" }
                ),
                opened,
                !opened,
            );
            return;
        }

        if !self.compare_types(&old_shape, &new_shape, &path, &field) {
            return;
        }
        self.compare_values(&old_shape, &new_shape, &path, &field);
        self.compare_format_and_range(&old_shape, &new_shape, &path, &field);
        if old_shape.is_object || new_shape.is_object {
            self.compare_objects(&old_shape, &new_shape, &path);
        }
        match (old_shape.items, new_shape.items) {
            (Some(a), Some(b)) => self.compare(a, b, format!("{path}/items")),
            (None, Some(_)) => self.push(
                &format!("{path}/items"),
                format!("{field}: array items now constrained"),
                false,
                true,
            ),
            (Some(_), None) => self.push(
                &format!("{path}/items"),
                format!("{field}: array items no longer constrained"),
                true,
                false,
            ),
            (None, None) => {}
        }
        self.compare_alternatives(&old_shape, &new_shape, &path, &field);
    }

    /// Returns false when the types are unrelated (no point looking deeper).
    fn compare_types(&mut self, old: &Shape<'_>, new: &Shape<'_>, path: &str, field: &str) -> bool {
        if old.types == new.types || (old.types.is_empty() && new.types.is_empty()) {
            return true;
        }
        let accepts = |set: &BTreeSet<String>, t: &str| {
            set.is_empty() || set.contains(t) || (t == "integer" && set.contains("number"))
        };
        // An empty set is "any type": going from any to some types narrows,
        // from some types to any widens (an empty `all` would say both).
        let widened = !old.types.is_empty() && old.types.iter().all(|t| accepts(&new.types, t));
        let narrowed = !new.types.is_empty() && new.types.iter().all(|t| accepts(&old.types, t));
        let from = type_list(&old.types);
        let to = type_list(&new.types);
        let only_null_added = !old.types.is_empty()
            && new.types.contains("null")
            && !old.types.contains("null")
            && new
                .types
                .iter()
                .filter(|t| *t != "null")
                .eq(old.types.iter());
        let only_null_removed = !new.types.is_empty()
            && old.types.contains("null")
            && !new.types.contains("null")
            && old
                .types
                .iter()
                .filter(|t| *t != "null")
                .eq(new.types.iter());
        if only_null_added {
            self.push(
                path,
                format!("{field} became nullable ({from} → {to})"),
                true,
                false,
            );
            true
        } else if only_null_removed {
            self.push(
                path,
                format!("{field} is no longer nullable ({from} → {to})"),
                false,
                true,
            );
            true
        } else if widened {
            self.push(
                path,
                format!("{field}: type widened from {from} to {to}"),
                true,
                false,
            );
            true
        } else if narrowed {
            self.push(
                path,
                format!("{field}: type narrowed from {from} to {to}"),
                false,
                true,
            );
            true
        } else {
            self.push(
                path,
                format!("{field}: type changed from {from} to {to}"),
                false,
                false,
            );
            false
        }
    }

    fn compare_values(&mut self, old: &Shape<'_>, new: &Shape<'_>, path: &str, field: &str) {
        match (&old.values, &new.values) {
            (Some(a), Some(b)) => {
                for value in b.iter().filter(|v| !a.contains(v)) {
                    self.push(
                        path,
                        format!("{field}: enum value {value} added"),
                        true,
                        false,
                    );
                }
                for value in a.iter().filter(|v| !b.contains(v)) {
                    self.push(
                        path,
                        format!("{field}: enum value {value} removed"),
                        false,
                        true,
                    );
                }
            }
            (Some(_), None) => self.push(
                path,
                format!("{field}: no longer restricted to enum values"),
                true,
                false,
            ),
            (None, Some(_)) => self.push(
                path,
                format!("{field}: now restricted to enum values"),
                false,
                true,
            ),
            (None, None) => {}
        }
    }

    fn compare_format_and_range(
        &mut self,
        old: &Shape<'_>,
        new: &Shape<'_>,
        path: &str,
        field: &str,
    ) {
        let old_range = integer_range(old);
        let new_range = integer_range(new);
        if old_range != new_range && (old_range.is_some() || new_range.is_some()) {
            let (lo_a, hi_a) = old_range.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
            let (lo_b, hi_b) = new_range.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
            let widened = lo_b <= lo_a && hi_b >= hi_a;
            let narrowed = lo_b >= lo_a && hi_b <= hi_a;
            // Name the formats; when both have the same one (only `minimum`
            // or `maximum` changed), the bounds say what changed.
            let (from, to) = if old.format == new.format {
                (bounds_text(lo_a, hi_a), bounds_text(lo_b, hi_b))
            } else {
                (
                    old.format.unwrap_or("unbounded").to_owned(),
                    new.format.unwrap_or("unbounded").to_owned(),
                )
            };
            let description = if widened {
                format!("{field}: numeric range widened ({from} → {to})")
            } else if narrowed {
                format!("{field}: numeric range narrowed ({from} → {to})")
            } else {
                format!("{field}: numeric range changed ({from} → {to})")
            };
            self.push(path, description, widened, narrowed);
            return;
        }
        if integer_format_range(old.format).is_some() || integer_format_range(new.format).is_some()
        {
            return;
        }
        match (old.format, new.format) {
            (Some(a), Some(b)) if a != b => self.push(
                path,
                format!("{field}: format changed from {a} to {b}"),
                false,
                false,
            ),
            (Some(a), None) => self.push(
                path,
                format!("{field}: format {a} no longer required"),
                true,
                false,
            ),
            (None, Some(b)) => self.push(
                path,
                format!("{field}: format {b} now required"),
                false,
                true,
            ),
            _ => {}
        }
    }

    fn compare_objects(&mut self, old: &Shape<'a>, new: &Shape<'a>, path: &str) {
        let removed: Vec<&str> = old
            .properties
            .keys()
            .filter(|k| !new.properties.contains_key(*k))
            .copied()
            .collect();
        let added: Vec<&str> = new
            .properties
            .keys()
            .filter(|k| !old.properties.contains_key(*k))
            .copied()
            .collect();
        let mut renamed: Vec<(&str, &str)> = Vec::new();
        for gone in &removed {
            let old_schema = strip_annotations(old.properties[gone]);
            let candidates: Vec<&str> = added
                .iter()
                .filter(|a| !renamed.iter().any(|(_, taken)| taken == *a))
                .filter(|a| strip_annotations(new.properties[*a]) == old_schema)
                .copied()
                .collect();
            if candidates.len() == 1 {
                renamed.push((gone, candidates[0]));
            }
        }
        let names: BTreeSet<&str> = old
            .properties
            .keys()
            .chain(new.properties.keys())
            .copied()
            .collect();
        for name in names {
            let child_path = format!("{path}/properties/{name}");
            match (old.properties.get(name), new.properties.get(name)) {
                (Some(a), Some(b)) => {
                    let was_required = old.required.contains(name);
                    let is_required = new.required.contains(name);
                    if was_required && !is_required {
                        self.push(
                            &child_path,
                            format!("field `{name}` became optional"),
                            true,
                            false,
                        );
                    } else if !was_required && is_required {
                        self.push(
                            &child_path,
                            format!("field `{name}` became required"),
                            false,
                            true,
                        );
                    }
                    self.compare(a, b, child_path);
                }
                (None, Some(schema)) => {
                    if let Some((from, _)) = renamed.iter().find(|(_, to)| *to == name) {
                        let backward =
                            !new.required.contains(name) && new.additional.allows_unknown();
                        let forward =
                            !old.required.contains(from) && old.additional.allows_unknown();
                        self.push(
                            &child_path,
                            format!("field `{from}` renamed to `{name}`"),
                            backward,
                            forward,
                        );
                        continue;
                    }
                    let has_default = schema.get("default").is_some();
                    let required = new.required.contains(name) && !has_default;
                    let forward = old.additional.allows_unknown();
                    if required {
                        self.push(
                            &child_path,
                            format!("required field `{name}` added"),
                            false,
                            forward,
                        );
                    } else if has_default {
                        self.push(
                            &child_path,
                            format!("field `{name}` added with a default"),
                            true,
                            forward,
                        );
                    } else {
                        self.push(
                            &child_path,
                            format!("optional field `{name}` added"),
                            true,
                            forward,
                        );
                    }
                }
                (Some(_), None) => {
                    if renamed.iter().any(|(from, _)| *from == name) {
                        continue;
                    }
                    let backward = new.additional.allows_unknown();
                    let forward = !old.required.contains(name);
                    let kind = if old.required.contains(name) {
                        "required"
                    } else {
                        "optional"
                    };
                    self.push(
                        &child_path,
                        format!("{kind} field `{name}` removed"),
                        backward,
                        forward,
                    );
                }
                (None, None) => {}
            }
        }
        let location = format!("{path}/additionalProperties");
        // `field_name` already quotes: "field `total`", "the payload".
        let what = field_name(path);
        match (old.additional, new.additional) {
            (Additional::Allowed, Additional::Denied) => self.push(
                &location,
                format!("{what} no longer accepts unknown fields (additionalProperties: false)"),
                false,
                true,
            ),
            (Additional::Denied, Additional::Allowed) => self.push(
                &location,
                format!("{what} now accepts unknown fields"),
                true,
                false,
            ),
            (Additional::Schema(a), Additional::Schema(b)) => self.compare(a, b, location),
            (Additional::Schema(_), Additional::Allowed) => self.push(
                &location,
                format!("{what}: unknown fields no longer constrained"),
                true,
                false,
            ),
            (Additional::Allowed, Additional::Schema(_)) => self.push(
                &location,
                format!("{what}: unknown fields now constrained"),
                false,
                true,
            ),
            (Additional::Schema(_), Additional::Denied) => self.push(
                &location,
                format!("{what} no longer accepts unknown fields"),
                false,
                true,
            ),
            (Additional::Denied, Additional::Schema(_)) => self.push(
                &location,
                format!("{what} now accepts some unknown fields"),
                true,
                false,
            ),
            (Additional::Allowed, Additional::Allowed)
            | (Additional::Denied, Additional::Denied) => {}
        }
    }

    fn compare_alternatives(&mut self, old: &Shape<'a>, new: &Shape<'a>, path: &str, field: &str) {
        if old.alternatives.is_empty() && new.alternatives.is_empty() {
            return;
        }
        let old_root = self.old_root;
        let new_root = self.new_root;
        let key = |root: &'a Value, v: &'a Value| discriminator(Self::resolve(root, v).0);
        let mut unmatched_new: Vec<&'a Value> = new.alternatives.clone();
        for (index, alternative) in old.alternatives.iter().enumerate() {
            let stripped = strip_annotations(Self::resolve(old_root, alternative).0);
            if let Some(position) = unmatched_new
                .iter()
                .position(|n| strip_annotations(Self::resolve(new_root, n).0) == stripped)
            {
                unmatched_new.remove(position);
                continue;
            }
            let tag = key(old_root, alternative);
            if let Some(position) = unmatched_new
                .iter()
                .position(|n| tag.is_some() && key(new_root, n) == tag)
            {
                let counterpart = unmatched_new.remove(position);
                let label = tag.clone().unwrap_or_else(|| index.to_string());
                self.compare(alternative, counterpart, format!("{path}/oneOf/{label}"));
                continue;
            }
            let label = tag.unwrap_or_else(|| index.to_string());
            self.push(
                path,
                format!("{field}: variant {label} removed"),
                false,
                true,
            );
        }
        for alternative in unmatched_new {
            let label = key(new_root, alternative).unwrap_or_else(|| "(unnamed)".to_owned());
            self.push(path, format!("{field}: variant {label} added"), true, false);
        }
    }
}

fn contains_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(contains_ref),
        Value::Array(items) => items.iter().any(contains_ref),
        _ => false,
    }
}

/// A name for an enum alternative: a `const` property (internal tag) or the
/// single required key (external tag).
fn discriminator(alternative: &Value) -> Option<String> {
    let properties = alternative.get("properties")?.as_object()?;
    for (name, schema) in properties {
        if let Some(value) = schema.get("const") {
            return Some(format!("{name}={value}"));
        }
    }
    let required = alternative.get("required")?.as_array()?;
    if required.len() == 1 {
        return required[0].as_str().map(str::to_owned);
    }
    None
}

fn field_name(path: &str) -> String {
    match path.rsplit_once("/properties/") {
        Some((_, name)) if !name.contains('/') => format!("field `{name}`"),
        _ if path.is_empty() => "the payload".to_owned(),
        _ => format!("`{path}`"),
    }
}

fn type_list(types: &BTreeSet<String>) -> String {
    if types.is_empty() {
        return "any".to_owned();
    }
    types.iter().cloned().collect::<Vec<_>>().join("|")
}

fn integer_format_range(format: Option<&str>) -> Option<(f64, f64)> {
    Some(match format? {
        "int8" => (i8::MIN as f64, i8::MAX as f64),
        "int16" => (i16::MIN as f64, i16::MAX as f64),
        "int32" => (i32::MIN as f64, i32::MAX as f64),
        "int64" => (i64::MIN as f64, i64::MAX as f64),
        "uint8" => (0.0, u8::MAX as f64),
        "uint16" => (0.0, u16::MAX as f64),
        "uint32" => (0.0, u32::MAX as f64),
        "uint64" => (0.0, u64::MAX as f64),
        "uint" => (0.0, u64::MAX as f64),
        "int" => (i64::MIN as f64, i64::MAX as f64),
        _ => return None,
    })
}

/// A numeric range in words: `0..=255`, `>= 1`, `<= 10`, `unbounded`.
fn bounds_text(low: f64, high: f64) -> String {
    match (low.is_finite(), high.is_finite()) {
        (true, true) => format!("{low}..={high}"),
        (true, false) => format!(">= {low}"),
        (false, true) => format!("<= {high}"),
        (false, false) => "unbounded".to_owned(),
    }
}

/// The numeric range a shape admits, from its integer format and bounds.
fn integer_range(shape: &Shape<'_>) -> Option<(f64, f64)> {
    let from_format = integer_format_range(shape.format);
    if from_format.is_none() && shape.minimum.is_none() && shape.maximum.is_none() {
        return None;
    }
    let (mut low, mut high) = from_format.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
    if let Some(minimum) = shape.minimum {
        low = low.max(minimum);
    }
    if let Some(maximum) = shape.maximum {
        high = high.min(maximum);
    }
    Some((low, high))
}
