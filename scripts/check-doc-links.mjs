#!/usr/bin/env node
// Checks the documentation citations of the repository (`npm run test:docs`):
//
// - every `docs/X.md` and `docs/X.md#anchor` named in code, tests, scripts or the top-level
//   Markdown files, and every relative Markdown link in those files and in `docs/`, points at a
//   file that exists and, with an anchor, at a heading of that file (GitHub's slug rules:
//   lowercase, spaces to hyphens, punctuation dropped, `-1`, `-2`, … for repeats);
// - nothing cites a document a reader of the repository does not have: the contract files kept
//   outside it (`relay-protocol.md`, `identity.md`, `api.md`, `inbound-durability-hook.md`, a
//   `delivery.md` or `architecture.md` that is not under `docs/`), the delivery seed, or a bare
//   `§N` section number (an RFC's, `RFC 4648 §4`, is fine).
//
// Exits 1 listing every problem as `file:line: what`, in a stable order. No dependencies.

import { readdirSync, readFileSync, existsSync, statSync } from 'node:fs'
import { dirname, join, relative, resolve, sep } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const self = relative(root, fileURLToPath(import.meta.url)).split(sep).join('/')

/** Folders whose files are read, and top-level files; everything else is out of scope. */
const DIRS = ['crates', 'src', 'js', '__test__', 'scripts', 'fuzz', 'bench', 'demo', 'examples', 'docs']
const TOP_FILES = ['README.md', 'BENCHMARKS.md']
const SKIP_DIRS = new Set(['node_modules', 'target', '.git', 'corpus', 'artifacts', 'coverage'])
const EXTENSIONS = ['.rs', '.js', '.mjs', '.cjs', '.ts', '.mts', '.cts', '.md', '.toml']

/** @returns {string[]} repository-relative paths, `/`-separated, sorted */
function walk(dir) {
  const out = []
  const abs = join(root, dir)
  if (!existsSync(abs)) return out
  for (const entry of readdirSync(abs, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const rel = `${dir}/${entry.name}`
    if (entry.isDirectory()) {
      if (!SKIP_DIRS.has(entry.name)) out.push(...walk(rel))
    } else if (entry.isFile() && EXTENSIONS.some((ext) => entry.name.endsWith(ext))) {
      out.push(rel)
    }
  }
  return out
}

/** GitHub's heading slug (github-slugger): lowercase, punctuation dropped, spaces to hyphens. */
function slug(text) {
  return text
    .toLowerCase()
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/<[^>]*>/g, '')
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc}\- ]/gu, '')
    .replace(/ /g, '-')
}

/** @type {Map<string, Set<string> | null>} anchors of each Markdown file, null when absent */
const anchorCache = new Map()

function anchorsOf(path) {
  if (anchorCache.has(path)) return anchorCache.get(path)
  const abs = join(root, path)
  let anchors = null
  if (existsSync(abs) && statSync(abs).isFile()) {
    anchors = new Set()
    let fence = null
    for (const line of readFileSync(abs, 'utf8').split('\n')) {
      const f = /^ {0,3}(`{3,}|~{3,})/.exec(line)
      if (f) {
        if (fence === null) fence = f[1][0]
        else if (f[1][0] === fence) fence = null
        continue
      }
      if (fence !== null) continue
      const h = /^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$/.exec(line)
      if (h) {
        const base = slug(h[1].trim())
        let candidate = base
        for (let n = 1; anchors.has(candidate); n++) candidate = `${base}-${n}`
        anchors.add(candidate)
      }
      for (const a of line.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) anchors.add(a[1])
    }
  }
  anchorCache.set(path, anchors)
  return anchors
}

/** Outside documents and section numbers no reader of the repository can follow. */
const OUTSIDE = [
  [/(?<![\w-])(?:relay-protocol|identity|inbound-durability-hook|api)\.md\b/g, 'cites a document outside the repository'],
  [/(?:\/work\/|\.\.\/)?shared\/(?:spec|seeds|notes)\b/g, 'cites a file outside the repository'],
  [/(?<!RFC \d+ )§\s*\d[\d.]*/g, 'cites a section number; cite a docs/ heading instead'],
  [/\bthe delivery seed\b|\bseed table\b|\bthe seed's (?:table|fresh|opt-out|live|"|“)|\bseed "[A-Z]/gi, 'cites the delivery seed'],
]
/** `delivery.md` / `architecture.md` count as outside unless they are the ones under `docs/`. */
const BARE_DOC = /(?<![\w-])(?:delivery|architecture)\.md\b/g

const problems = []
let checked = 0

function lineOf(text, index) {
  let line = 1
  for (let i = text.indexOf('\n'); i !== -1 && i < index; i = text.indexOf('\n', i + 1)) line++
  return line
}

/** Checks that `target` (a repository-relative path) exists and holds `anchor`, if any. */
function resolveCitation(file, text, index, target, anchor, shown) {
  checked++
  const anchors = target.endsWith('.md') ? anchorsOf(target) : null
  if (target.endsWith('.md') ? anchors === null : !existsSync(join(root, target))) {
    problems.push([file, lineOf(text, index), `${shown}: no such file ${target}`])
  } else if (anchor && anchors && !anchors.has(anchor)) {
    problems.push([file, lineOf(text, index), `${shown}: no heading with anchor #${anchor} in ${target}`])
  }
}

const files = [...DIRS.flatMap(walk), ...TOP_FILES.filter((f) => existsSync(join(root, f)))]
for (const file of files) {
  if (file === self) continue
  const text = readFileSync(join(root, file), 'utf8')
  const inDocs = file.startsWith('docs/')
  const isMarkdown = file.endsWith('.md')

  if (!inDocs) {
    for (const m of text.matchAll(/(?<![\w.-])docs\/([\w.-]+\.md)(?:#([\p{L}\p{N}_-]+))?/gu)) {
      // A Markdown link's target is relative to its file: the link check below resolves it.
      if (isMarkdown && /\]\((?:\.{1,2}\/)*$/.test(text.slice(Math.max(0, m.index - 40), m.index))) continue
      resolveCitation(file, text, m.index, `docs/${m[1]}`, m[2], m[0])
    }
  }
  if (isMarkdown) {
    for (const m of text.matchAll(/\]\(([^)\s]*?)(?:#([^)\s]+))?\)/g)) {
      const [, path, anchor] = m
      if (/^[a-z][a-z0-9+.-]*:/i.test(path) || path.startsWith('/')) continue
      if (path !== '' && !path.endsWith('.md')) continue
      const target = path === '' ? file : relative(root, resolve(root, dirname(file), path)).split(sep).join('/')
      resolveCitation(file, text, m.index, target, anchor, m[0].slice(2, -1))
    }
  }

  for (const [pattern, what] of OUTSIDE) {
    for (const m of text.matchAll(pattern)) problems.push([file, lineOf(text, m.index), `${m[0]}: ${what}`])
  }
  if (!inDocs) {
    for (const m of text.matchAll(BARE_DOC)) {
      if (text.slice(Math.max(0, m.index - 5), m.index) === 'docs/') continue
      problems.push([file, lineOf(text, m.index), `${m[0]}: cites a document outside the repository; use docs/${m[0]}`])
    }
  }
}

if (problems.length > 0) {
  problems.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]))
  for (const [file, line, what] of problems) console.error(`${file}:${line}: ${what}`)
  console.error(`check-doc-links: ${problems.length} problem(s) in ${files.length} files`)
  process.exit(1)
}
console.log(`check-doc-links: ${checked} citations in ${files.length} files resolve`)
