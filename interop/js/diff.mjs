// Differential client: the published @openfeature/flagd-provider, in-process resolver, run over
// a set of flag configuration documents either in offline file mode or syncing each document
// from flagd-proxy over gRPC. Protocol: interop/differential.md.
//
// Environment:
//   INTEROP_DIFF_JOB (the job file), INTEROP_DEBUG (any value: provider debug logging).
//
// Stdout: one JSON line per document. Everything else goes to stderr.

import { readFileSync } from 'node:fs';
import { OpenFeature } from '@openfeature/server-sdk';
import { FlagdProvider } from '@openfeature/flagd-provider';

const MAX_AT_ONCE = 8;
const READY_GUARD_MS = 15_000;
const CLOSE_GUARD_MS = 5_000;

const BOOLEAN_DEFAULT = false;
const STRING_DEFAULT = '<default>';
const NUMBER_DEFAULT = -1;
const objectDefault = () => ({ default: true });

const debug = !!process.env.INTEROP_DEBUG;

function describe(value) {
  if (value instanceof Error) return value.stack || value.message;
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}

// A logger whose lines name what they belong to; `quiet()` silences it once the provider it
// serves has been shut down (a closed provider may still report on its way out).
function makeLogger(tag) {
  let silenced = false;
  const write = (level, args) => {
    if (silenced) return;
    process.stderr.write(`interop-js-diff [${level}] ${tag}: ${args.map(describe).join(' ')}\n`);
  };
  return {
    error: (...a) => write('error', a),
    warn: (...a) => write('warn', a),
    info: (...a) => write('info', a),
    debug: (...a) => {
      if (debug) write('debug', a);
    },
    quiet: () => {
      silenced = true;
    },
  };
}

const mainLog = makeLogger('main');

function errorMessage(err) {
  if (err === undefined || err === null) return 'unknown error';
  if (typeof err === 'string') return err;
  if (typeof err.message === 'string' && err.message !== '') return err.message;
  if (err.code !== undefined) return String(err.code);
  return describe(err);
}

function upperOrNull(value) {
  return value === undefined || value === null ? null : String(value).toUpperCase();
}

function details(d) {
  return {
    value: d?.value === undefined ? null : d.value,
    variant: d?.variant === undefined || d?.variant === null ? null : String(d.variant),
    reason: upperOrNull(d?.reason),
    errorCode: upperOrNull(d?.errorCode),
  };
}

function sleep(ms) {
  let timer;
  const promise = new Promise((resolve) => {
    timer = setTimeout(resolve, ms);
  });
  return { promise, cancel: () => clearTimeout(timer) };
}

function readJob() {
  const path = process.env.INTEROP_DIFF_JOB;
  if (!path) throw new Error('environment variable INTEROP_DIFF_JOB is required');
  const job = JSON.parse(readFileSync(path, 'utf8'));
  if (job.mode !== 'file' && job.mode !== 'sync') {
    throw new Error(`job mode is neither "file" nor "sync": ${describe(job.mode)}`);
  }
  if (!Array.isArray(job.documents)) throw new Error('job has no "documents" array');
  return job;
}

function providerOptions(job, doc) {
  // Every option that the provider would otherwise take from FLAGD_* environment variables is
  // given here, so the environment cannot switch modes or targets behind the job's back.
  const common = {
    resolverType: 'in-process',
    socketPath: undefined,
    certPath: undefined,
    tls: false,
  };
  if (job.mode === 'file') {
    if (typeof doc.path !== 'string' || doc.path === '') {
      throw new Error('document has no "path"');
    }
    return { ...common, offlineFlagSourcePath: doc.path, selector: '' };
  }
  const port = Number(job.port);
  if (!Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new Error(`job port is not a port: ${describe(job.port)}`);
  }
  return {
    ...common,
    offlineFlagSourcePath: undefined,
    host: typeof job.host === 'string' && job.host !== '' ? job.host : '127.0.0.1',
    port,
    selector: typeof doc.selector === 'string' ? doc.selector : '',
  };
}

// Waits for the provider's first READY or ERROR: the SDK resolves the promise on READY and
// rejects it with the initialization error on ERROR (fatal errors included).
async function firstEvent(domain, provider) {
  const guard = sleep(READY_GUARD_MS);
  try {
    return await Promise.race([
      OpenFeature.setProviderAndWait(domain, provider).then(
        () => ({ event: 'READY' }),
        (err) => ({ event: 'ERROR', detail: errorMessage(err) }),
      ),
      guard.promise.then(() => ({ event: 'timeout' })),
    ]);
  } finally {
    guard.cancel();
  }
}

async function evaluateAll(client, flags, contexts) {
  const answers = {};
  for (const flag of flags) {
    const perContext = [];
    for (const raw of contexts) {
      const context = raw && typeof raw === 'object' && !Array.isArray(raw) ? { ...raw } : {};
      const b = await client.getBooleanDetails(flag, BOOLEAN_DEFAULT, context);
      const s = await client.getStringDetails(flag, STRING_DEFAULT, context);
      const n = await client.getNumberDetails(flag, NUMBER_DEFAULT, context);
      const o = await client.getObjectDetails(flag, objectDefault(), context);
      perContext.push([details(b), details(s), details(n), details(o)]);
    }
    answers[flag] = perContext;
  }
  return answers;
}

async function shutDown(provider, log) {
  const guard = sleep(CLOSE_GUARD_MS);
  try {
    const closed = await Promise.race([
      Promise.resolve()
        .then(() => provider.onClose())
        .then(() => true),
      guard.promise.then(() => false),
    ]);
    if (!closed) log.warn(`provider did not close within ${CLOSE_GUARD_MS} ms`);
  } catch (err) {
    log.warn('closing the provider failed:', errorMessage(err));
  } finally {
    guard.cancel();
    log.quiet();
  }
}

async function runDocument(job, doc, index) {
  const id = String(doc.id);
  const log = makeLogger(id);
  if (job.mode === 'sync' && doc.served === false) {
    return { id, ready: false, event: 'not served' };
  }
  const flags = Array.isArray(doc.flags) ? doc.flags.map(String) : [];
  const contexts = Array.isArray(job.contexts) ? job.contexts : [];
  const domain = `interop-diff-${job.mode}-${index}-${id}`;
  let provider;
  try {
    provider = new FlagdProvider(providerOptions(job, doc), log);
    const first = await firstEvent(domain, provider);
    if (first.event !== 'READY') {
      log.info(`first event ${first.event}${first.detail ? `: ${first.detail}` : ''}`);
      return first.detail === undefined
        ? { id, ready: false, event: first.event }
        : { id, ready: false, event: first.event, detail: first.detail };
    }
    const answers = await evaluateAll(OpenFeature.getClient(domain), flags, contexts);
    // The line is built here so that a value JSON cannot hold fails for this document only.
    return { id, ready: true, answers, text: JSON.stringify({ id, ready: true, answers }) };
  } catch (err) {
    log.error('failed:', err);
    return { id, ready: false, event: 'exception', detail: errorMessage(err) };
  } finally {
    if (provider) await shutDown(provider, log);
  }
}

function lineFor(result, doc) {
  if (result.text !== undefined) return result.text;
  try {
    return JSON.stringify(result);
  } catch (err) {
    return JSON.stringify({
      id: String(doc?.id),
      ready: false,
      event: 'exception',
      detail: errorMessage(err),
    });
  }
}

async function main() {
  OpenFeature.setLogger(mainLog);
  const job = readJob();
  const documents = job.documents;
  let next = 0;
  const worker = async () => {
    while (next < documents.length) {
      const index = next++;
      const doc = documents[index];
      let result;
      try {
        result = await runDocument(job, doc, index);
      } catch (err) {
        result = { id: String(doc?.id), ready: false, event: 'exception', detail: errorMessage(err) };
      }
      process.stdout.write(`${lineFor(result, doc)}\n`);
    }
  };
  const workers = [];
  for (let i = 0; i < Math.min(MAX_AT_ONCE, documents.length); i++) workers.push(worker());
  await Promise.all(workers);
}

process.on('unhandledRejection', (reason) => mainLog.warn('unhandled rejection:', reason));
process.on('uncaughtException', (err) => mainLog.error('uncaught exception:', err));

// Closed providers can leave timers or sockets behind; the process ends once stdout is flushed.
function finish(code) {
  process.stdout.write('', () => process.exit(code));
}

main().then(
  () => finish(0),
  (err) => {
    mainLog.error('job failed:', err);
    finish(2);
  },
);
