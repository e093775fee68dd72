// The sending rules of runtime/sending.py for the C++ backends, free of Triton:
// - a row's `Outbox`: what comes while the row's send waits or is in flight goes out with its next send, in order;
//   after the first send, pieces wait until `interval` units of them do; the last step runs after every send due
//   before it, with the pieces no send was due for; a failed send ends the row's sending;
// - `TakeTurn`: one sender's turn of a row (sending.Outbox.take_turn);
// - `Senders`: threads that give queued rows their turns, oldest first; a row that wants another turn goes behind
//   the rows that waited (sending.Senders, without its bound: the producers here are Triton's response threads).
// tests/unit/runtime/test_native_outbox.py holds the outbox to sending.Outbox on seeded scripts.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tritonforge {
namespace sending {

// What a sender's turn of a row does.
enum class Turn { kSend, kLast, kIdle };

// One row's pieces on their way out, and whether a sender holds the row (a queued row counts as held). It has no
// lock of its own: the row's owner guards it, with the rest of the row's state, by one lock and calls every method
// under it; the send and the last step run outside that lock (TakeTurn).
template <typename Piece>
class Outbox {
 public:
  void set_interval(int64_t interval) { interval_ = interval < 1 ? 1 : interval; }

  // A piece of output worth `size` units of the interval. True when the caller must schedule the row: a send is due
  // and no sender holds the row.
  bool Add(Piece piece, int64_t size) {
    if (failed_) return false;  // nothing follows a lost response
    pending_.push_back(std::move(piece));
    pending_size_ += size;
    return Hold(Due());
  }

  // The row's end: its last step runs once every send due before it is done. No piece follows it. True when the
  // caller must schedule the row.
  bool End() {
    last_due_ = true;
    return Hold(true);
  }

  // The sender's, at the start of its turn: kSend with every piece due; kLast with the pieces no send was due for
  // (none after a failure), the row then held for good; kIdle when there is nothing to do (the row let go).
  Turn Take(std::vector<Piece>* pieces) {
    if (Due()) {
      TakePending(pieces);
      sent_any_ = true;
      return Turn::kSend;
    }
    if (last_due_) {
      last_due_ = false;
      TakePending(pieces);
      return Turn::kLast;
    }
    held_ = false;
    return Turn::kIdle;
  }

  // The sender's, after a kSend turn's send: one that was not sent marks the row failed and drops what waits. True
  // when the row wants another turn.
  bool Sent(bool sent) {
    if (!sent) {
      failed_ = true;
      pending_.clear();
      pending_size_ = 0;
    }
    held_ = Due() || last_due_;
    return held_;
  }

  // A send failed: the row's owner stops making output for it and ends it with an error.
  bool failed() const { return failed_; }

 private:
  bool Due() const { return !pending_.empty() && (!sent_any_ || pending_size_ >= interval_); }

  bool Hold(bool wanted) {
    if (held_ || !wanted) return false;  // the sender holding the row takes it on its next turn
    held_ = true;
    return true;
  }

  void TakePending(std::vector<Piece>* pieces) {
    *pieces = std::move(pending_);
    pending_.clear();
    pending_size_ = 0;
  }

  int64_t interval_ = 1;
  std::vector<Piece> pending_;
  int64_t pending_size_ = 0;
  bool sent_any_ = false;  // after the first send, pieces wait for the interval
  bool held_ = false;
  bool last_due_ = false;
  bool failed_ = false;
};

// One turn of a row: `mutex` guards `outbox`; `send(pieces)` sends one response of them and says whether it was
// sent; `last(rest)` is the row's last step. Neither may throw: they run on a sender. True when the row wants
// another turn.
template <typename Piece, typename Send, typename Last>
bool TakeTurn(std::mutex& mutex, Outbox<Piece>& outbox, Send&& send, Last&& last) {
  std::vector<Piece> pieces;
  Turn turn;
  {
    std::lock_guard<std::mutex> lock(mutex);
    turn = outbox.Take(&pieces);
  }
  if (turn == Turn::kIdle) return false;
  if (turn == Turn::kLast) {
    last(std::move(pieces));
    return false;
  }
  const bool sent = send(pieces);
  std::lock_guard<std::mutex> lock(mutex);
  return outbox.Sent(sent);
}

// A few threads that give queued rows their turns, oldest first. `turn(row)` runs one turn and says whether the row
// wants another; a row is queued by whoever its outbox told to schedule it, so it is in the queue at most once.
template <typename Row>
class Senders {
 public:
  Senders(int threads, std::function<bool(Row*)> turn) : turn_(std::move(turn)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Serve(); });
  }
  ~Senders() { Close(); }
  Senders(const Senders&) = delete;
  Senders& operator=(const Senders&) = delete;

  void Schedule(Row* row) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(row);
    }
    work_.notify_one();
  }

  // Gives the queued rows their turns, then ends the threads.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    work_.notify_all();
    for (std::thread& thread : threads_)
      if (thread.joinable()) thread.join();
  }

 private:
  void Serve() {
    for (;;) {
      Row* row = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [this] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;
        row = queue_.front();
        queue_.pop_front();
      }
      if (turn_(row)) Schedule(row);  // more to do: behind the rows that waited
    }
  }

  std::function<bool(Row*)> turn_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Row*> queue_;
  bool closed_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace sending
}  // namespace tritonforge
