"""What the synthetic speakers say: parallel English / Mandarin sentences.

The words carry no emotion of their own (any sentence is spoken with any emotion), so the
emotion must be heard in the prosody; the references quote the words, as MER2024's quote the
subtitle, which asks a captioner to recognise what was said as well.
"""

SENTENCES: tuple[tuple[str, str], ...] = (
    ("The meeting has been moved to Thursday afternoon.", "会议改到星期四下午了。"),
    ("I left the keys on the kitchen table.", "我把钥匙放在厨房的桌子上了。"),
    ("Your brother called while you were out.", "你出去的时候你哥哥打电话来了。"),
    ("The train leaves at seven tomorrow morning.", "火车明天早上七点出发。"),
    ("They painted the whole house in one weekend.", "他们一个周末就把整栋房子刷完了。"),
    ("We are going to sell the old car.", "我们要把那辆旧车卖掉。"),
    ("She finished the report before lunch.", "她在午饭前写完了报告。"),
    ("The letter arrived three days late.", "那封信晚到了三天。"),
    ("He has decided to move to another city.", "他决定搬到另一个城市去。"),
    ("The shop on the corner is closing down.", "街角那家商店要关门了。"),
    ("My results came back from the hospital today.", "我的检查结果今天从医院出来了。"),
    ("Someone opened the door in the middle of the night.", "半夜有人打开了门。"),
    ("The dog ran out into the street again.", "那条狗又跑到街上去了。"),
    ("I have to give the speech in front of everyone.", "我得在所有人面前讲话。"),
    ("They changed the password without telling me.", "他们没告诉我就改了密码。"),
    ("The price of the tickets went up again.", "票价又涨了。"),
    ("Our teacher is leaving the school next month.", "我们的老师下个月要离开学校了。"),
    ("The package was left outside in the rain.", "包裹被放在外面淋了雨。"),
    ("You told me the same story yesterday.", "你昨天跟我讲过同样的事。"),
    ("We won the game in the last minute.", "我们在最后一分钟赢了比赛。"),
    ("The lights went out during the storm.", "暴风雨的时候灯灭了。"),
    ("He borrowed my camera and never returned it.", "他借了我的相机一直没还。"),
    ("The doctor wants to see you again next week.", "医生想下周再见你一次。"),
    ("I found a letter from my grandmother in the drawer.", "我在抽屉里找到一封奶奶写的信。"),
    ("They are building a new road behind our house.", "他们在我们房子后面修一条新路。"),
    ("The exam results will be posted on Friday.", "考试成绩星期五公布。"),
    ("My phone fell into the river.", "我的手机掉进河里了。"),
    ("She is coming home for the holidays.", "她放假要回家了。"),
    ("Somebody ate the cake I saved for tonight.", "有人把我留到今晚的蛋糕吃了。"),
    ("The flight has been cancelled because of fog.", "因为大雾航班取消了。"),
    ("I got the job at the bank.", "我得到了银行的那份工作。"),
    ("There is water all over the bathroom floor.", "浴室地上全是水。"),
    ("He forgot my birthday again this year.", "他今年又忘了我的生日。"),
    ("The neighbours are having another party tonight.", "邻居今晚又要开派对。"),
    ("We have to start the whole project from the beginning.", "整个项目我们得从头开始。"),
    ("The cat is sleeping on my coat.", "猫在我的外套上睡觉。"),
    ("Nobody answered the phone at the office.", "办公室没人接电话。"),
    ("They found the wallet under the seat.", "他们在座位底下找到了钱包。"),
    ("The milk in the fridge has gone bad.", "冰箱里的牛奶坏了。"),
    ("My sister is getting married in spring.", "我妹妹春天要结婚了。"),
    ("The bus did not stop at our station.", "公交车没在我们站停。"),
    ("I heard footsteps on the stairs.", "我听到楼梯上有脚步声。"),
    ("The factory will close at the end of the year.", "工厂年底要关闭了。"),
    ("He sent the message to the wrong person.", "他把消息发错了人。"),
    ("We are moving into the new flat on Monday.", "我们星期一搬进新公寓。"),
    ("The rent is going up by a third.", "房租要涨三分之一。"),
    ("You can see the mountains from the window.", "从窗户能看到山。"),
    ("The manager wants to talk to you right now.", "经理现在就要找你谈话。"),
)


_INDEX = {en: i for i, (en, _) in enumerate(SENTENCES)}


def sentence_index(text_en: str | None) -> int:
    """Index of the sentence in SENTENCES, -1 for any other text (MER2024's subtitles) or none."""
    return _INDEX.get(text_en, -1) if text_en else -1
