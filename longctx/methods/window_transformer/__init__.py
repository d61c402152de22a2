"""The no-memory baseline: a plain causal transformer over independent windows (`network`, `module`,
`flops`); the minimal method of docs/architecture.md, "Adding a method"."""
