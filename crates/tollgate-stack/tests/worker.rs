//! The worker-utilization shedder over real TCP: under rising load `Low` is shed first, then `Normal`, then
//! `High`, while `Critical` passes; once load drops, shedding recedes step by step.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_http::HttpLimitLayer;
use tollgate_http::priority::HeaderPriority;
use tollgate_stack::WorkerShedLayer;
use tollgate_tower::Priority;

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
        assert!(reply.body.contains("problems/shed"), "{}", reply.body);
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

    // Load drops: every held request finishes.
    gate.release(held.len());
    for task in held {
        assert_eq!(task.await.unwrap().status, 200);
    }
    // Shedding recedes one step per interval: Low goes 100 → 50 → 0, not at once.
    let mut seen = vec![levels.shed_percent(Priority::Low)];
    for _ in 0..10 {
        probe(addr, Priority::Critical).await;
        seen.push(levels.shed_percent(Priority::Low));
    }
    seen.dedup();
    assert_eq!(
        seen,
        [100, 50, 0],
        "Low's shed level after the load dropped"
    );
    for p in Priority::ALL {
        assert_eq!(levels.shed_percent(p), 0);
    }
    all_pass(addr, Priority::Low, 3).await;
    assert_eq!(levels.in_flight(), 0, "every request was counted out");
}

/// Issue 17's defect, black-box: capacity 10, 20 `Low` requests at once, then 4 `Critical`. The controller alone
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
        assert!(reply.body.contains("problems/shed"), "{}", reply.body);
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
