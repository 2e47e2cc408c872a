//! The worker-utilization shedder over real TCP: under rising load `Low` is shed first, then `Normal`, then
//! `High`, while `Critical` passes; once load drops, shedding recedes step by step.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tollgate_http::HttpLimitLayer;
use tollgate_http::priority::HeaderPriority;
use tollgate_tower::Priority;
use tollgate_tower::WorkerShedLayer;

use support::{Gate, app, get, serve};

/// The controller's interval: levels move one step per interval.
const INTERVAL: Duration = Duration::from_millis(40);

/// A little longer than the interval, so that every probe lets the controller evaluate once and no more (an
/// evaluation also catches up the intervals no request came in; a probe is late by one only past twice this).
const PAUSE: Duration = Duration::from_millis(45);

async fn probe(addr: SocketAddr, priority: Priority) -> u16 {
    tokio::time::sleep(PAUSE).await;
    let reply = get(addr, "/fast", &[("x-priority", priority.as_str())]).await;
    if reply.status == 503 {
        assert!(
            reply
                .body
                .contains("http-problem-types#temporary-reduced-capacity")
                && reply.body.contains(r#""kind":"shed""#),
            "{}",
            reply.body
        );
        assert_eq!(reply.header("retry-after"), "1");
    }
    reply.status.as_u16()
}

/// Probes `priority` until two in a row are shed (its level reached 100 %); fails after 20 probes.
async fn until_fully_shed(addr: SocketAddr, priority: Priority) {
    let mut in_a_row = 0;
    for _ in 0..20 {
        if probe(addr, priority).await == 503 {
            in_a_row += 1;
            if in_a_row == 2 {
                return;
            }
        } else {
            in_a_row = 0;
        }
    }
    panic!("{priority} requests were never fully shed");
}

/// A `Critical` probe (it always passes) after [`PAUSE`]: when it was sent and when its reply came.
async fn timed_probe(addr: SocketAddr) -> (Instant, Instant) {
    tokio::time::sleep(PAUSE).await;
    let sent = Instant::now();
    let reply = get(addr, "/fast", &[("x-priority", "critical")]).await;
    assert_eq!(reply.status, 200, "Critical must pass");
    (sent, Instant::now())
}

/// Whole controller intervals in `d`.
fn intervals(d: Duration) -> u64 {
    u64::try_from(d.as_nanos() / INTERVAL.as_nanos()).unwrap_or(u64::MAX)
}

/// A shed level after `steps` evaluations without load (step 50 %).
fn recede(level: u8, steps: u64) -> u8 {
    level.saturating_sub(u8::try_from(steps.min(2) * 50).unwrap_or(100))
}

async fn all_pass(addr: SocketAddr, priority: Priority, n: usize) {
    for _ in 0..n {
        assert_eq!(probe(addr, priority).await, 200, "{priority} must pass");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowest_class_shed_first_critical_passes_and_shedding_recedes() {
    // Capacity 10 and the default thresholds (Low 60 %, Normal 75 %, High 90 %, Critical 100 %); levels move 50
    // points per evaluation. A probe in flight adds one to the held requests.
    let shedder = WorkerShedLayer::new(10, HeaderPriority::new())
        .unwrap()
        .interval(INTERVAL)
        .step_percent(50)
        .unwrap();
    let levels = shedder.clone();
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(shedder)))).await;
    let mut held = Vec::new();
    let mut hold = async |n: usize| {
        for _ in 0..n {
            held.push(tokio::spawn(async move {
                get(addr, "/hold", &[("x-priority", "critical")]).await
            }));
        }
        gate.wait_entered(held.len()).await;
    };

    // 6 held + a probe = 70 %: only Low is shed.
    hold(6).await;
    until_fully_shed(addr, Priority::Low).await;
    all_pass(addr, Priority::Normal, 5).await;
    all_pass(addr, Priority::High, 5).await;
    all_pass(addr, Priority::Critical, 5).await;
    assert_eq!(levels.shed_percent(Priority::Low), 100);
    assert_eq!(levels.shed_percent(Priority::Normal), 0);

    // 80 %: Normal joins; High and Critical pass; Low stays shed.
    hold(1).await;
    until_fully_shed(addr, Priority::Normal).await;
    all_pass(addr, Priority::High, 5).await;
    all_pass(addr, Priority::Critical, 5).await;
    assert_eq!(probe(addr, Priority::Low).await, 503);

    // 90 %: High joins; Critical still passes.
    hold(1).await;
    until_fully_shed(addr, Priority::High).await;
    all_pass(addr, Priority::Critical, 5).await;
    assert_eq!(levels.shed_percent(Priority::Critical), 0);
    assert_eq!(levels.in_flight(), 8);

    // The last evaluation under load, timed: the one the first after the drop counts its intervals from.
    let mut previous = timed_probe(addr).await;
    assert_eq!(levels.shed_percent(Priority::Low), 100);
    // Load drops: every held request finishes.
    gate.release(held.len());
    for task in held {
        assert_eq!(task.await.unwrap().status, 200);
    }
    // Shedding recedes one step per interval: Low goes 100 → 50 → 0, not at once. Each probe's evaluation falls
    // between its send and its reply, so the intervals since the previous evaluation are known within bounds, and
    // the level must have receded by exactly one of those counts. (The first evaluation after the drop still sees
    // the peak under load and holds the level; only the intervals it catches up recede.)
    let mut level = 100;
    let mut seen = vec![level];
    let mut late = false;
    for i in 0..10 {
        let timed = timed_probe(addr).await;
        let fewest = intervals(timed.0 - previous.1);
        let most = intervals(timed.1 - previous.0);
        let (fewest, most) = if i == 0 {
            (fewest.saturating_sub(1), most.saturating_sub(1))
        } else {
            (fewest, most)
        };
        let now = levels.shed_percent(Priority::Low);
        let allowed: Vec<u8> = (fewest..=most).map(|steps| recede(level, steps)).collect();
        assert!(
            allowed.contains(&now),
            "Low went from {level} to {now} % in {fewest}..={most} intervals"
        );
        late |= most >= 2;
        level = now;
        seen.push(level);
        previous = timed;
    }
    seen.dedup();
    assert_eq!(seen.last(), Some(&0), "Low's shed level receded: {seen:?}");
    if !late {
        assert_eq!(
            seen,
            [100, 50, 0],
            "Low's shed level after the load dropped"
        );
    }
    for p in Priority::ALL {
        assert_eq!(levels.shed_percent(p), 0);
    }
    all_pass(addr, Priority::Low, 3).await;
    assert_eq!(levels.in_flight(), 0, "every request was counted out");
}

/// A defect once found (critical requests shed behind low ones), black-box: capacity 10, 20 `Low` requests at once, then 4 `Critical`. The controller alone
/// (levels moved once per interval) let all 20 `Low` in and then shed `Critical`; the gate caps `Low` at its line
/// (60 %: 6) at arrival, and `Critical` gets the capacity kept for it, however long the instance stays full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_low_cannot_fill_the_instance_and_critical_is_admitted() {
    // An evaluation at (almost) every request: the controller gets every chance to shed Critical.
    let shedder = WorkerShedLayer::new(10, HeaderPriority::new())
        .unwrap()
        .interval(Duration::from_millis(1));
    let levels = shedder.clone();
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(shedder)))).await;
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let burst = |priority: &'static str, n: usize| {
        for _ in 0..n {
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                let reply = get(addr, "/hold", &[("x-priority", priority)]).await;
                done_tx.send((priority, reply)).unwrap();
            });
        }
    };
    // Waits until the requests that entered the handler and those answered since the last call make `total`;
    // returns those answers.
    let settle = async |done: &mut tokio::sync::mpsc::UnboundedReceiver<_>, total: usize| {
        let mut answered = Vec::new();
        for _ in 0..2000 {
            while let Ok(reply) = done.try_recv() {
                answered.push(reply);
            }
            if gate.entered.load(Ordering::SeqCst) + answered.len() >= total {
                return answered;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "of {total} requests {} entered and {} were answered",
            gate.entered.load(Ordering::SeqCst),
            answered.len()
        );
    };

    burst("low", 20);
    let shed = settle(&mut done, 20).await;
    assert_eq!(
        gate.entered.load(Ordering::SeqCst),
        6,
        "Low admitted beyond its line (60 % of 10)"
    );
    assert_eq!(shed.len(), 14);
    for (_, reply) in &shed {
        assert_eq!(reply.status, 503);
        assert!(reply.body.contains(r#""kind":"shed""#), "{}", reply.body);
        assert_eq!(reply.header("retry-after"), "1");
    }

    burst("critical", 4);
    let answered = settle(&mut done, 10).await;
    assert!(answered.is_empty(), "Critical shed: {answered:#?}");
    gate.wait_entered(10).await;
    assert_eq!(levels.in_flight(), 10);

    // Full (100 %) for many evaluations: only the gate turns Critical away, the controller never ramps it.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let reply = get(addr, "/fast", &[("x-priority", "critical")]).await;
        assert_eq!(reply.status, 503, "no capacity left");
    }
    assert_eq!(levels.shed_percent(Priority::Critical), 0);
    assert_eq!(levels.shed_percent(Priority::Low), 100);

    // One Low finishes (the semaphore is fair: the first held are the Low ones): Critical takes the slot.
    gate.release(1);
    let (priority, reply) = done.recv().await.unwrap();
    assert_eq!((priority, reply.status.as_u16()), ("low", 200));
    let reply = get(addr, "/fast", &[("x-priority", "critical")]).await;
    assert_eq!(reply.status, 200, "capacity left, Critical admitted");
    assert_eq!(
        get(addr, "/fast", &[("x-priority", "low")]).await.status,
        503,
        "Low still at its line"
    );

    gate.release(9);
    for _ in 0..9 {
        assert_eq!(done.recv().await.unwrap().1.status, 200);
    }
    assert_eq!(levels.in_flight(), 0, "every request was counted out");
}
