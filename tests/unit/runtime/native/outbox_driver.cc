// Drives outbox.h for tests/unit/runtime/test_native_outbox.py.
// `outbox_driver script` reads a script on stdin, one step a line, and prints what each step did:
//   row R INTERVAL   a row with that stream interval
//   add R PIECE SIZE a piece for row R    -> "scheduled R" when the row must be queued
//   end R            row R's end          -> "scheduled R" likewise
//   fail R           row R's next send fails
//   while R PIECE SIZE  a piece for row R that comes while its next send is in flight
//   turn             the oldest queued row takes a turn -> "turn R", then "send R a,b" or "last R a,b", then
//                    "again R" when it wants another turn (queued behind the others); "nothing" on an empty queue
// `outbox_driver threads ROWS PIECES` runs ROWS producers against two real senders and prints "ok" when every row's
// responses carried its pieces in order, its last step ran once and after them; else what went wrong.
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "outbox.h"

namespace sending = tritonforge::sending;

namespace {

std::string Joined(const std::vector<std::string>& pieces) {
  std::string out;
  for (size_t i = 0; i < pieces.size(); ++i) out += (i ? "," : "") + pieces[i];
  return out;
}

struct ScriptRow {
  std::mutex mutex;
  sending::Outbox<std::string> outbox;
  bool fail_next = false;
  std::vector<std::pair<std::string, int64_t>> while_sending;  // added during the next send
};

int Script() {
  std::map<int, std::unique_ptr<ScriptRow>> rows;
  std::deque<int> queue;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string step;
    int id = -1;
    words >> step;
    if (step == "turn") {
      if (queue.empty()) {
        std::printf("nothing\n");
        continue;
      }
      id = queue.front();
      queue.pop_front();
      std::printf("turn %d\n", id);
      ScriptRow& row = *rows.at(id);
      auto send = [&](const std::vector<std::string>& pieces) {
        std::printf("send %d %s\n", id, Joined(pieces).c_str());
        for (auto& [piece, size] : row.while_sending) {  // the producer goes on meanwhile: under the row's lock
          std::lock_guard<std::mutex> lock(row.mutex);
          if (row.outbox.Add(piece, size)) std::printf("scheduled %d\n", id);  // never: a sender holds the row
        }
        row.while_sending.clear();
        const bool sent = !row.fail_next;
        row.fail_next = false;
        return sent;
      };
      auto last = [&](std::vector<std::string> rest) { std::printf("last %d %s\n", id, Joined(rest).c_str()); };
      if (sending::TakeTurn(row.mutex, row.outbox, send, last)) {
        std::printf("again %d\n", id);
        queue.push_back(id);
      }
      continue;
    }
    words >> id;
    if (step == "row") {
      int64_t interval = 1;
      words >> interval;
      rows[id] = std::make_unique<ScriptRow>();
      rows[id]->outbox.set_interval(interval);
      continue;
    }
    ScriptRow& row = *rows.at(id);
    bool schedule = false;
    if (step == "add") {
      std::string piece;
      int64_t size = 1;
      words >> piece >> size;
      std::lock_guard<std::mutex> lock(row.mutex);
      schedule = row.outbox.Add(piece, size);
    } else if (step == "end") {
      row.while_sending.clear();  // the producer is done: nothing follows a row's end
      std::lock_guard<std::mutex> lock(row.mutex);
      schedule = row.outbox.End();
    } else if (step == "fail") {
      row.fail_next = true;
    } else if (step == "while") {
      std::string piece;
      int64_t size = 1;
      words >> piece >> size;
      row.while_sending.emplace_back(piece, size);
    } else {
      std::fprintf(stderr, "unknown step: %s\n", line.c_str());
      return 2;
    }
    if (schedule) {
      std::printf("scheduled %d\n", id);
      queue.push_back(id);
    }
  }
  return 0;
}

struct ThreadRow {
  std::mutex mutex;
  sending::Outbox<int> outbox;
  std::vector<int> received;  // the senders': one sender holds the row at a time
  int lasts = 0;
  std::vector<int> after_last;
};

int Threads(int row_count, int pieces) {
  std::vector<std::unique_ptr<ThreadRow>> rows;
  for (int i = 0; i < row_count; ++i) {
    rows.push_back(std::make_unique<ThreadRow>());
    rows.back()->outbox.set_interval(1 + i % 3);
  }
  {
    sending::Senders<ThreadRow> senders(2, [](ThreadRow* row) {
      auto send = [row](const std::vector<int>& got) {
        if (row->lasts) row->after_last.insert(row->after_last.end(), got.begin(), got.end());
        row->received.insert(row->received.end(), got.begin(), got.end());
        return true;
      };
      auto last = [row](std::vector<int> rest) {
        row->received.insert(row->received.end(), rest.begin(), rest.end());
        row->lasts += 1;
      };
      return sending::TakeTurn(row->mutex, row->outbox, send, last);
    });
    std::vector<std::thread> producers;
    for (auto& owned : rows) {
      ThreadRow* row = owned.get();
      producers.emplace_back([row, pieces, &senders] {
        for (int piece = 0; piece <= pieces; ++piece) {
          bool schedule;
          {
            std::lock_guard<std::mutex> lock(row->mutex);
            schedule = piece < pieces ? row->outbox.Add(piece, 1) : row->outbox.End();
          }
          if (schedule) senders.Schedule(row);
        }
      });
    }
    for (std::thread& producer : producers) producer.join();
  }  // the senders close: every queued turn runs first
  for (int i = 0; i < row_count; ++i) {
    const ThreadRow& row = *rows[static_cast<size_t>(i)];
    std::vector<int> expected;
    for (int piece = 0; piece < pieces; ++piece) expected.push_back(piece);
    if (row.received != expected || row.lasts != 1 || !row.after_last.empty()) {
      std::printf("row %d: %zu pieces received of %d, %d last steps, %zu pieces after the last\n", i,
                  row.received.size(), pieces, row.lasts, row.after_last.size());
      return 0;
    }
  }
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "script" && argc == 2) return Script();
  if (mode == "threads" && argc == 4) return Threads(std::stoi(argv[2]), std::stoi(argv[3]));
  std::fprintf(stderr, "usage: outbox_driver script < steps | outbox_driver threads ROWS PIECES\n");
  return 2;
}
