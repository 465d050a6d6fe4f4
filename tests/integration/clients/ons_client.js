'use strict';
// A second, independent client for the compatibility tests: ali-ons, a pure-JavaScript port of
// RocketMQ 4.x's Java client (npm), driven by tests/integration/test_ali_ons.py.
//
//   node ons_client.js produce '<json>'   json: {namesrv, group, messages: [{topic, tags, body, keys,
//                                          props, delayLevel}]}; prints [{status, msgId, queueOffset,
//                                          queueId}] as one line 'RESULT <json>'
//   node ons_client.js consume '<json>'   json: {namesrv, group, topic, expression (tag expression or
//                                          {expressionType, subString}), count, timeoutMs,
//                                          retryOnce: [bodies answered ACTION_RETRY on first delivery],
//                                          settleMs}; prints the deliveries as 'RESULT <json>' and
//                                          exits 0 once `count` deliveries were made and `settleMs`
//                                          passed without more (1 on timeout)
// ali-ons logs to stdout too. Client errors (e.g. a retry topic not routed yet at start, as with Java's client) go to stderr.
const path = require('path');
const { Producer, Consumer, Message } = require(path.join(process.env.ONS_MODULES, 'ali-ons'));

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
// ali-ons asserts an HTTP client for Aliyun's address service; with nameSrv set it is never used.
const httpclient = { request() { throw new Error('unused: nameSrv is set'); } };

function common(spec) {
  return {
    httpclient, nameSrv: spec.namesrv, accessKeyId: 'unused', accessKeySecret: 'unused',
    instanceName: `ons-${process.pid}`, pollNameServerInteval: 1000, rebalanceInterval: 1000,
    persistConsumerOffsetInterval: 500, heartbeatBrokerInterval: 1000,
  };
}

async function produce(spec) {
  const producer = new Producer({ ...common(spec), producerGroup: spec.group });
  producer.on('error', err => console.error('producer error:', err.message));
  await producer.ready();
  const results = [];
  for (const m of spec.messages) {
    const msg = new Message(m.topic, m.tags || '', m.body);
    if (m.keys) msg.keys = m.keys;
    if (m.delayLevel) msg.delayTimeLevel = m.delayLevel;
    for (const [k, v] of Object.entries(m.props || {})) msg.properties[k] = v;
    const r = await producer.send(msg);
    results.push({ status: r.sendStatus, msgId: r.msgId, queueOffset: r.queueOffset,
      queueId: Number(r.messageQueue.queueId) });
  }
  await producer.close();
  return results;
}

async function consume(spec) {
  const consumer = new Consumer({
    ...common(spec), consumerGroup: spec.group, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
  });
  consumer.on('error', err => console.error('consumer error:', err.message));
  const retryOnce = new Set(spec.retryOnce || []);
  const deliveries = [];
  let last = Date.now();
  consumer.subscribe(spec.topic, spec.expression || '*', async msg => {
    const body = msg.body.toString();
    deliveries.push({
      body, topic: msg.topic, tags: msg.tags || null, keys: msg.keys || null, props: msg.properties,
      reconsumeTimes: msg.reconsumeTimes, queueId: msg.queueId, queueOffset: Number(msg.queueOffset),
      bornTimestamp: Number(msg.bornTimestamp), storeTimestamp: Number(msg.storeTimestamp),
      receivedAt: Date.now(),
    });
    last = Date.now();
    if (retryOnce.delete(body)) return Consumer.ACTION_RETRY;
    return undefined;
  });
  await consumer.ready();
  const start = Date.now();
  let ok = false;
  while (Date.now() - start < spec.timeoutMs) {
    if (deliveries.length >= spec.count && Date.now() - last >= (spec.settleMs || 0)) { ok = true; break; }
    await sleep(50);
  }
  await sleep(1200);  // > persistConsumerOffsetInterval: the last offsets reach the broker
  await consumer.close();
  return { ok, deliveries };
}

(async () => {
  const [mode, json] = process.argv.slice(2);
  const spec = JSON.parse(json);
  if (mode === 'produce') {
    console.log('RESULT ' + JSON.stringify(await produce(spec)));
    process.exit(0);
  }
  const { ok, deliveries } = await consume(spec);
  console.log('RESULT ' + JSON.stringify(deliveries));
  process.exit(ok ? 0 : 1);
})().catch(err => { console.error('FAIL', err && err.stack || err); process.exit(2); });
