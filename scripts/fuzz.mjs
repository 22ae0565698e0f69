#!/usr/bin/env node
// Runs every cargo-fuzz target under fuzz/ for a bounded time and reports executions, coverage
// and crashes per target. Exits non-zero when any target crashed.
//
//   node scripts/fuzz.mjs [--seconds N] [--jobs N] [--sanitizer none|address] [target ...]
//
// New corpus entries go to fuzz/work/corpus/<target> (not committed); the committed seeds in
// fuzz/corpus/<target> are read only. Crashing inputs land in fuzz/artifacts/<target>/.
import { spawn, spawnSync } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const fuzzDir = join(root, 'fuzz');
const TARGETS = ['frame_decode', 'message_decode', 'address_parse', 'relay_session'];
const DICTIONARIES = { frame_decode: 'frames.dict', message_decode: 'message.dict' };
// relay_session runs whole relay sessions; the others decode one string.
const TIMEOUT_SECONDS = { relay_session: 60 };

function usage(message) {
  if (message) console.error(`fuzz: ${message}`);
  console.error(
    'usage: node scripts/fuzz.mjs [--seconds N] [--jobs N] [--sanitizer none|address] [target ...]\n' +
      `targets: ${TARGETS.join(', ')}`,
  );
  process.exit(2);
}

function positiveInteger(flag, value) {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) usage(`${flag} needs a positive integer, got ${value}`);
  return n;
}

function parseArgs(argv) {
  const options = { seconds: 60, jobs: 1, sanitizer: 'none', targets: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--seconds') options.seconds = positiveInteger(arg, value());
    else if (arg === '--jobs') options.jobs = positiveInteger(arg, value());
    else if (arg === '--sanitizer') {
      options.sanitizer = value();
      if (!['none', 'address'].includes(options.sanitizer)) usage(`unknown sanitizer ${options.sanitizer}`);
    } else if (arg === '--help' || arg === '-h') usage();
    else if (TARGETS.includes(arg)) options.targets.push(arg);
    else usage(`unknown argument ${arg}`);
  }
  if (options.targets.length === 0) options.targets = TARGETS;
  return options;
}

// The stable toolchain refuses the -Z flags AddressSanitizer needs unless told it may.
function cargoEnv(sanitizer) {
  return sanitizer === 'address' ? { ...process.env, RUSTC_BOOTSTRAP: '1' } : process.env;
}

function cargoFuzzArgs(command, options) {
  const targetDir = process.env.COURIER_FUZZ_TARGET_DIR ?? join(fuzzDir, 'target');
  return ['fuzz', command, '--sanitizer', options.sanitizer, '--target-dir', targetDir];
}

function build(options) {
  const check = spawnSync('cargo', ['fuzz', '--version'], { cwd: root, encoding: 'utf8' });
  if (check.status !== 0) {
    console.error('fuzz: cargo-fuzz is missing; install it with `cargo install cargo-fuzz`');
    process.exit(2);
  }
  console.log(`building ${options.targets.join(', ')} (sanitizer: ${options.sanitizer})`);
  for (const target of options.targets) {
    const built = spawnSync('cargo', [...cargoFuzzArgs('build', options), target], {
      cwd: root,
      env: cargoEnv(options.sanitizer),
      stdio: 'inherit',
    });
    if (built.status !== 0) {
      console.error(`fuzz: building ${target} failed`);
      process.exit(1);
    }
  }
}

// libFuzzer's progress lines look like `#1234 NEW cov: 56 ft: 78 corp: 9/100b ... exec/s: 10`.
function parseLog(text) {
  const result = {
    runs: null,
    seconds: null,
    cov: null,
    ft: null,
    corpus: null,
    execPerSec: null,
    rssMb: null,
  };
  for (const line of text.split('\n')) {
    const progress = line.match(/^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)/);
    if (progress) {
      result.runs = Number(progress[1]);
      result.cov = Number(progress[2]);
      result.ft = Number(progress[3]);
      result.corpus = Number(progress[4]);
    }
    const done = line.match(/^Done (\d+) runs in (\d+) second/);
    if (done) {
      result.runs = Number(done[1]);
      result.seconds = Number(done[2]);
    }
    const units = line.match(/^stat::number_of_executed_units:\s+(\d+)/);
    if (units) result.runs = Number(units[1]);
    const speed = line.match(/^stat::average_exec_per_sec:\s+(\d+)/);
    if (speed) result.execPerSec = Number(speed[1]);
    const rss = line.match(/^stat::peak_rss_mb:\s+(\d+)/);
    if (rss) result.rssMb = Number(rss[1]);
  }
  return result;
}

function runTarget(target, options) {
  const corpus = join(fuzzDir, 'work', 'corpus', target);
  const artifacts = join(fuzzDir, 'artifacts', target);
  const logs = join(fuzzDir, 'work', 'logs');
  for (const dir of [corpus, artifacts, logs]) mkdirSync(dir, { recursive: true });
  const seeds = join(fuzzDir, 'corpus', target);
  const libfuzzer = [
    `-max_total_time=${options.seconds}`,
    `-timeout=${TIMEOUT_SECONDS[target] ?? 10}`,
    '-rss_limit_mb=2048',
    '-print_final_stats=1',
    `-artifact_prefix=${artifacts}/`,
  ];
  if (DICTIONARIES[target]) libfuzzer.push(`-dict=${join(fuzzDir, 'dict', DICTIONARIES[target])}`);
  const args = [...cargoFuzzArgs('run', options), target, corpus];
  if (existsSync(seeds)) args.push(seeds);
  args.push('--', ...libfuzzer);
  const logPath = join(logs, `${target}.log`);
  const log = createWriteStream(logPath);
  const before = new Set(readdirSync(artifacts));
  console.log(`fuzzing ${target} for ${options.seconds} s (log: ${logPath})`);
  return new Promise((resolveRun) => {
    const child = spawn('cargo', args, { cwd: root, env: cargoEnv(options.sanitizer) });
    let text = '';
    const collect = (chunk) => {
      text += chunk;
      log.write(chunk);
    };
    child.stdout.on('data', collect);
    child.stderr.on('data', collect);
    child.on('close', (code) => {
      log.end();
      const found = readdirSync(artifacts).filter((f) => !before.has(f));
      resolveRun({ target, code, crashes: found.map((f) => join(artifacts, f)), ...parseLog(text) });
    });
  });
}

async function runAll(options) {
  const queue = [...options.targets];
  const results = [];
  const worker = async () => {
    while (queue.length > 0) results.push(await runTarget(queue.shift(), options));
  };
  await Promise.all(Array.from({ length: Math.min(options.jobs, queue.length) }, worker));
  return results.sort((a, b) => TARGETS.indexOf(a.target) - TARGETS.indexOf(b.target));
}

const options = parseArgs(process.argv.slice(2));
build(options);
const results = await runAll(options);
console.log('\ntarget           runs        exec/s  cov    ft     corpus  rss MB  crashes');
for (const r of results) {
  const cell = (v, w) => String(v ?? '?').padEnd(w);
  console.log(
    `${cell(r.target, 17)}${cell(r.runs, 12)}${cell(r.execPerSec, 8)}${cell(r.cov, 7)}${cell(r.ft, 7)}` +
      `${cell(r.corpus, 8)}${cell(r.rssMb, 8)}${r.crashes.length}`,
  );
  for (const crash of r.crashes) console.log(`  ${crash}`);
  if (r.crashes.length === 0 && r.code !== 0) console.log(`  exited with ${r.code} without an artifact`);
}
const failed = results.filter((r) => r.crashes.length > 0 || r.code !== 0);
process.exit(failed.length > 0 ? 1 : 0);
