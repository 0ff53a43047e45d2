"""Regex and JSON Schema -> token automata for constrained decoding (numpy + interegular; no torch).

    pattern --parse_regex (regex_parse, regex_dfa)--> CharDFA --compile_regex (regex_fsm)--> TokenFSM
    schema  --schema_to_regex (json_schema, json_parts, json_pattern; standard library)--> pattern

``token_texts`` reads the vocabulary's token texts from an HF tokenizer; ``RegexCache``
keeps compiled automata per pattern, bounded by bytes. Import the modules themselves:
``json_schema`` is standard library only, so the gateway loads numpy only for a schema.
"""
