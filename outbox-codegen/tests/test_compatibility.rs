//! Compatibility classification, one fixture pair per rule
//! (`tests/fixtures/compat/<rule>/{old,new}.json`, JSON Schemas as schemars
//! writes them): every change found with its path, words and the two
//! answers (backward: new readers read old data; forward: old readers read
//! new data), and the class of the whole diff.

mod common;

use std::fs;

use outbox_codegen::{
    Change, Classification, Compatibility, classify, first_difference, strip_annotations,
};
use serde_json::{Value, json};

use Compatibility::{Backward, Breaking, Forward, Full};

/// One expected change: path, description, backward, forward.
type Expected = (&'static str, &'static str, bool, bool);

/// Every fixture pair with its class and changes, in walk order.
const RULES: &[(&str, Compatibility, &[Expected])] = &[
    // Fields added.
    (
        "field_added_optional",
        Full,
        &[(
            "/properties/note",
            "optional field `note` added",
            true,
            true,
        )],
    ),
    (
        "field_added_required",
        Forward,
        &[(
            "/properties/quantity",
            "required field `quantity` added",
            false,
            true,
        )],
    ),
    (
        "field_added_with_default",
        Full,
        &[(
            "/properties/quantity",
            "field `quantity` added with a default",
            true,
            true,
        )],
    ),
    (
        // Old readers deny unknown fields: they cannot read the new field.
        "field_added_closed",
        Backward,
        &[(
            "/properties/note",
            "optional field `note` added",
            true,
            false,
        )],
    ),
    // Fields removed.
    (
        "field_removed_optional",
        Full,
        &[(
            "/properties/note",
            "optional field `note` removed",
            true,
            true,
        )],
    ),
    (
        "field_removed_required",
        Backward,
        &[(
            "/properties/quantity",
            "required field `quantity` removed",
            true,
            false,
        )],
    ),
    (
        // New readers deny unknown fields: old data still carries `note`.
        "field_removed_closed",
        Forward,
        &[(
            "/properties/note",
            "optional field `note` removed",
            false,
            true,
        )],
    ),
    // Renames (a removed and an added field with the same schema).
    (
        "field_renamed",
        Breaking,
        &[(
            "/properties/mass",
            "likely rename of field `weight` to `mass` (one field removed and one of the same schema added): new readers never see values written as `weight`, old readers never see `mass`; map it in an upcaster",
            false,
            false,
        )],
    ),
    (
        "field_renamed_optional",
        Breaking,
        &[(
            "/properties/mass",
            "likely rename of field `weight` to `mass` (one field removed and one of the same schema added): new readers never see values written as `weight`, old readers never see `mass`; map it in an upcaster",
            false,
            false,
        )],
    ),
    // Required-ness.
    (
        "field_became_optional",
        Backward,
        &[(
            "/properties/quantity",
            "field `quantity` became optional",
            true,
            false,
        )],
    ),
    (
        "field_became_required",
        Forward,
        &[(
            "/properties/quantity",
            "field `quantity` became required",
            false,
            true,
        )],
    ),
    // Types.
    (
        "type_changed",
        Breaking,
        &[(
            "/properties/quantity",
            "field `quantity`: type changed from integer to string",
            false,
            false,
        )],
    ),
    (
        "type_widened",
        Backward,
        &[
            (
                "/properties/amount",
                "field `amount`: type widened from integer to number",
                true,
                false,
            ),
            (
                "/properties/amount",
                "field `amount`: numeric range widened (int64 (-9223372036854775808..=9223372036854775807) → double)",
                true,
                false,
            ),
        ],
    ),
    (
        "type_narrowed",
        Forward,
        &[
            (
                "/properties/amount",
                "field `amount`: type narrowed from number to integer",
                false,
                true,
            ),
            (
                "/properties/amount",
                "field `amount`: numeric range narrowed (double → int64 (-9223372036854775808..=9223372036854775807))",
                false,
                true,
            ),
        ],
    ),
    (
        // `serde_json::Value` is the schema `true`: any type.
        "type_widened_to_any",
        Backward,
        &[(
            "/properties/detail",
            "field `detail`: type widened from string to any",
            true,
            false,
        )],
    ),
    (
        "type_narrowed_from_any",
        Forward,
        &[(
            "/properties/detail",
            "field `detail`: type narrowed from any to string",
            false,
            true,
        )],
    ),
    (
        "integer_widened",
        Backward,
        &[(
            "/properties/count",
            "field `count`: numeric range widened (int32 (-2147483648..=2147483647) → int64 (-9223372036854775808..=9223372036854775807))",
            true,
            false,
        )],
    ),
    (
        "integer_narrowed",
        Forward,
        &[(
            "/properties/count",
            "field `count`: numeric range narrowed (int64 (-9223372036854775808..=9223372036854775807) → int32 (-2147483648..=2147483647))",
            false,
            true,
        )],
    ),
    (
        "integer_sign_changed",
        Breaking,
        &[(
            "/properties/count",
            "field `count`: numeric range changed (uint32 (0..=4294967295) → int32 (-2147483648..=2147483647))",
            false,
            false,
        )],
    ),
    (
        // `#[schemars(range(min = 1))]`: same format, other bounds.
        "integer_minimum_raised",
        Forward,
        &[(
            "/properties/quantity",
            "field `quantity`: numeric range narrowed (0..=4294967295 → 1..=4294967295)",
            false,
            true,
        )],
    ),
    (
        "format_added",
        Forward,
        &[(
            "/properties/id",
            "field `id`: format uuid now required",
            false,
            true,
        )],
    ),
    (
        "format_removed",
        Backward,
        &[(
            "/properties/id",
            "field `id`: format uuid no longer required",
            true,
            false,
        )],
    ),
    (
        "format_changed",
        Breaking,
        &[(
            "/properties/id",
            "field `id`: format changed from uuid to date-time",
            false,
            false,
        )],
    ),
    // Nullability.
    (
        "became_nullable",
        Backward,
        &[(
            "/properties/note",
            "field `note` became nullable (string → null|string)",
            true,
            false,
        )],
    ),
    (
        "no_longer_nullable",
        Forward,
        &[(
            "/properties/note",
            "field `note` is no longer nullable (null|string → string)",
            false,
            true,
        )],
    ),
    (
        // `Option<Money>`: `anyOf [{$ref}, {type: null}]`.
        "became_nullable_ref",
        Backward,
        &[(
            "/properties/total",
            "field `total` became nullable (object → null|object)",
            true,
            false,
        )],
    ),
    // Enums of unit variants (`enum`, or `oneOf` of `const` when documented).
    (
        "enum_value_added",
        Backward,
        &[(
            "/properties/status",
            "field `status`: enum value \"lost\" added",
            true,
            false,
        )],
    ),
    (
        "enum_value_removed",
        Forward,
        &[(
            "/properties/status",
            "field `status`: enum value \"lost\" removed",
            false,
            true,
        )],
    ),
    (
        "enum_value_added_documented",
        Backward,
        &[(
            "/properties/status",
            "field `status`: enum value \"lost\" added",
            true,
            false,
        )],
    ),
    (
        "enum_restriction_added",
        Forward,
        &[(
            "/properties/status",
            "field `status`: now restricted to enum values",
            false,
            true,
        )],
    ),
    (
        "enum_restriction_removed",
        Backward,
        &[(
            "/properties/status",
            "field `status`: no longer restricted to enum values",
            true,
            false,
        )],
    ),
    // Tagged enums (`oneOf` of objects with a `const` tag).
    (
        "variant_added",
        Backward,
        &[(
            "/properties/shape",
            "field `shape`: variant kind=\"triangle\" added",
            true,
            false,
        )],
    ),
    (
        "variant_removed",
        Forward,
        &[(
            "/properties/shape",
            "field `shape`: variant kind=\"square\" removed",
            false,
            true,
        )],
    ),
    (
        "variant_changed",
        Forward,
        &[(
            "/properties/shape/oneOf/kind=\"circle\"/properties/unit",
            "required field `unit` added",
            false,
            true,
        )],
    ),
    // Nested objects through `$ref` / `$defs`.
    (
        "nested_field_added",
        Forward,
        &[(
            "/properties/total/properties/currency",
            "required field `currency` added",
            false,
            true,
        )],
    ),
    (
        "nested_closed",
        Forward,
        &[(
            "/properties/total/additionalProperties",
            "field `total` no longer accepts unknown fields (additionalProperties: false)",
            false,
            true,
        )],
    ),
    (
        // One definition used twice is compared once, at its first use in
        // walk order (properties sorted by name).
        "nested_shared_definition",
        Forward,
        &[(
            "/properties/shipping/properties/currency",
            "required field `currency` added",
            false,
            true,
        )],
    ),
    (
        // The root referenced from inside (`$ref: "#"`) is compared once
        // more at that place, then the recursion stops.
        "recursive_type",
        Full,
        &[
            (
                "/properties/children/items/properties/note",
                "optional field `note` added",
                true,
                true,
            ),
            (
                "/properties/note",
                "optional field `note` added",
                true,
                true,
            ),
        ],
    ),
    // Unknown fields (`#[serde(deny_unknown_fields)]`).
    (
        "additional_properties_denied",
        Forward,
        &[(
            "/additionalProperties",
            "the payload no longer accepts unknown fields (additionalProperties: false)",
            false,
            true,
        )],
    ),
    (
        "additional_properties_allowed",
        Backward,
        &[(
            "/additionalProperties",
            "the payload now accepts unknown fields",
            true,
            false,
        )],
    ),
    (
        // Map values: `additionalProperties` as a schema.
        "map_values_widened",
        Backward,
        &[(
            "/properties/counts/additionalProperties",
            "`/properties/counts/additionalProperties`: numeric range widened (int32 (-2147483648..=2147483647) → int64 (-9223372036854775808..=9223372036854775807))",
            true,
            false,
        )],
    ),
    (
        // `serde_json::Map<String, Value>` → `BTreeMap<String, i64>`.
        "map_values_constrained",
        Forward,
        &[(
            "/properties/counts/additionalProperties",
            "field `counts`: unknown fields now constrained",
            false,
            true,
        )],
    ),
    (
        // A map becomes a closed object without properties.
        "map_closed",
        Forward,
        &[(
            "/properties/counts/additionalProperties",
            "field `counts` no longer accepts unknown fields",
            false,
            true,
        )],
    ),
    // Arrays.
    (
        "array_item_field_added",
        Forward,
        &[(
            "/properties/lines/items/properties/quantity",
            "required field `quantity` added",
            false,
            true,
        )],
    ),
    (
        "array_items_type_changed",
        Breaking,
        &[(
            "/properties/tags/items",
            "`/properties/tags/items`: type changed from string to integer",
            false,
            false,
        )],
    ),
    (
        "array_items_widened",
        Backward,
        &[(
            "/properties/counts/items",
            "`/properties/counts/items`: numeric range widened (int32 (-2147483648..=2147483647) → int64 (-9223372036854775808..=9223372036854775807))",
            true,
            false,
        )],
    ),
    (
        "array_items_constrained",
        Forward,
        &[(
            "/properties/tags/items",
            "field `tags`: array items now constrained",
            false,
            true,
        )],
    ),
    // Documentation only: titles and descriptions are not the contract.
    ("docs_only", Full, &[]),
];

fn load(rule: &str, side: &str) -> Value {
    let path = common::fixture(&format!("compat/{rule}/{side}.json"));
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn classify_rule(rule: &str) -> Classification {
    classify(&load(rule, "old"), &load(rule, "new"))
}

#[test]
fn every_rule_has_its_exact_changes_and_class() {
    let mut failures = Vec::new();
    for (rule, class, expected) in RULES {
        let classification = classify_rule(rule);
        let found: Vec<(&str, &str, bool, bool)> = classification
            .changes
            .iter()
            .map(|c| {
                (
                    c.path.as_str(),
                    c.description.as_str(),
                    c.backward,
                    c.forward,
                )
            })
            .collect();
        if found != *expected || classification.compatibility() != *class {
            failures.push(format!(
                "{rule}: expected {class} {expected:#?}\n  found {} {found:#?}",
                classification.compatibility()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fixture_pair_is_in_the_table_and_the_reverse() {
    let mut on_disk: Vec<String> = fs::read_dir(common::fixture("compat"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = RULES.iter().map(|(r, _, _)| (*r).to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    for rule in &listed {
        for side in ["old", "new"] {
            assert!(
                common::fixture(&format!("compat/{rule}/{side}.json")).is_file(),
                "{rule}/{side}.json"
            );
        }
    }
}

#[test]
fn a_schema_compared_with_itself_is_full_with_no_change() {
    for (rule, _, _) in RULES {
        for side in ["old", "new"] {
            let schema = load(rule, side);
            let classification = classify(&schema, &schema);
            assert_eq!(classification.changes, vec![], "{rule}/{side}");
            assert_eq!(classification.compatibility(), Full);
            assert_eq!(classification.describe(), "no contract change");
        }
    }
}

#[test]
fn the_class_of_a_diff_is_the_weakest_of_its_changes() {
    let change = |backward, forward| Change {
        path: "/".into(),
        rule: "test",
        description: String::new(),
        backward,
        forward,
    };
    assert_eq!(change(true, true).compatibility(), Full);
    assert_eq!(change(true, false).compatibility(), Backward);
    assert_eq!(change(false, true).compatibility(), Forward);
    assert_eq!(change(false, false).compatibility(), Breaking);
    let mixed = Classification {
        changes: vec![change(true, false), change(false, true)],
    };
    assert_eq!(mixed.compatibility(), Breaking);
    let backward = Classification {
        changes: vec![change(true, true), change(true, false)],
    };
    assert_eq!(backward.compatibility(), Backward);
    assert_eq!(Classification::default().compatibility(), Full);
    assert!(Full.is_backward() && Backward.is_backward());
    assert!(!Forward.is_backward() && !Breaking.is_backward());
}

#[test]
fn describe_lists_each_change_with_its_class() {
    assert_eq!(
        classify_rule("type_widened").describe(),
        "field `amount`: type widened from integer to number [backward]; \
         field `amount`: numeric range widened (int64 (-9223372036854775808..=9223372036854775807) → double) [backward]"
    );
    assert_eq!(
        classify_rule("field_renamed").describe(),
        "likely rename of field `weight` to `mass` (one field removed and one of the same schema added): new readers never see values written as `weight`, old readers never see `mass`; map it in an upcaster [breaking]"
    );
}

#[test]
fn compatibility_is_written_in_lowercase() {
    for (class, text) in [
        (Full, "full"),
        (Backward, "backward"),
        (Forward, "forward"),
        (Breaking, "breaking"),
    ] {
        assert_eq!(class.to_string(), text);
        assert_eq!(serde_json::to_value(class).unwrap(), json!(text));
        assert_eq!(
            serde_json::from_value::<Compatibility>(json!(text)).unwrap(),
            class
        );
    }
}

#[test]
fn strip_annotations_removes_documentation_at_schema_positions_only() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Payload",
        "description": "A payload.",
        "type": "object",
        "properties": {
            "description": {"type": "string", "description": "A field named description."},
            "items": {"type": "array", "items": {"type": "string", "examples": ["a"]}},
            "choice": {"anyOf": [{"type": "string", "deprecated": true}, {"type": "null"}]}
        },
        "$defs": {"Money": {"type": "object", "title": "Money", "$comment": "cents"}},
        "required": ["description"]
    });
    assert_eq!(
        strip_annotations(&schema),
        json!({
            "type": "object",
            "properties": {
                "description": {"type": "string"},
                "items": {"type": "array", "items": {"type": "string"}},
                "choice": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "$defs": {"Money": {"type": "object"}},
            "required": ["description"]
        })
    );
    let docs_old = load("docs_only", "old");
    let docs_new = load("docs_only", "new");
    assert_ne!(docs_old, docs_new);
    assert_eq!(strip_annotations(&docs_old), strip_annotations(&docs_new));
}

#[test]
fn first_difference_gives_a_json_pointer_and_both_values() {
    assert_eq!(first_difference(&json!({"a": 1}), &json!({"a": 1})), None);
    assert_eq!(
        first_difference(
            &json!({"a": {"b/c": [1, 2], "d~e": 1}}),
            &json!({"a": {"b/c": [1, 3], "d~e": 1}})
        ),
        Some(("/a/b~1c/1".to_owned(), Some(json!(2)), Some(json!(3))))
    );
    assert_eq!(
        first_difference(&json!({"a": {"d~e": 1}}), &json!({"a": {}})),
        Some(("/a/d~0e".to_owned(), Some(json!(1)), None))
    );
    assert_eq!(
        first_difference(&json!([1]), &json!([1, 2])),
        Some(("/1".to_owned(), None, Some(json!(2))))
    );
    assert_eq!(
        first_difference(&json!(1), &json!("1")),
        Some(("/".to_owned(), Some(json!(1)), Some(json!("1"))))
    );
    // The first difference of the published and the changed fixture.
    let (pointer, before, after) = first_difference(
        &strip_annotations(&load("type_changed", "old")),
        &strip_annotations(&load("type_changed", "new")),
    )
    .unwrap();
    assert_eq!(pointer, "/properties/quantity/format");
    assert_eq!(before, Some(json!("uint32")));
    assert_eq!(after, None);
}

#[test]
fn unrelated_schemas_do_not_panic_and_are_breaking() {
    let cases = [
        (json!(true), json!(false)),
        (json!({"type": "object"}), json!({"type": "string"})),
        (
            json!({"$ref": "#/$defs/Missing"}),
            json!({"type": "string"}),
        ),
        (json!({"$ref": "#"}), json!({"$ref": "#"})),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}}),
            json!({"type": "object", "properties": {"a": {"type": "string"}}}),
        ),
    ];
    for (old, new) in &cases {
        let classification = classify(old, new);
        if old != new {
            assert_ne!(classification.changes, vec![], "{old} → {new}");
        }
    }
    assert_eq!(
        classify(&json!(true), &json!(false)).changes,
        vec![Change {
            path: "/".into(),
            rule: "schema-closed",
            description: "the payload now rejects every value".into(),
            backward: false,
            forward: true,
        }]
    );
    assert_eq!(
        classify(&json!({"type": "object"}), &json!({"type": "string"})).compatibility(),
        Breaking
    );
}
